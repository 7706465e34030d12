//! A cap on concurrent connections: the listener hands tonic only
//! connections that got a permit; one over the cap is closed at once and
//! logged (the client sees UNAVAILABLE and may retry).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Future, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

use crate::session::Session;

/// The session of each client connection (by connection id): an entry
/// from the connection's accept to its close, filled at its first
/// statement.
pub type ConnectionSessions = Arc<std::sync::Mutex<HashMap<u64, Option<Arc<tokio::sync::Mutex<Session>>>>>>;

/// What a request knows about its connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    /// Unique for the server's life (addresses are reused).
    pub id: u64,
}

impl ConnInfo {
    /// The connection of a request, plaintext or TLS.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<ConnInfo> {
        let ext = request.extensions();
        ext.get::<ConnInfo>().copied().or_else(|| {
            ext.get::<tonic::transport::server::TlsConnectInfo<ConnInfo>>()
                .map(|t| *t.get_ref())
        })
    }
}

static NEXT_CONNECTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A connection holding one of the cap's permits until it closes; its
/// session (`SET` options) is forgotten then.
pub struct Limited {
    inner: TcpStream,
    _permit: OwnedSemaphorePermit,
    info: ConnInfo,
    settings: ConnectionSessions,
    /// Until the client has sent its first bytes (the HTTP/2 preface, or a
    /// TLS hello): a connection that does not is closed when this fires,
    /// so silent connections cannot hold every permit.
    opening: Option<Pin<Box<tokio::time::Sleep>>>,
    received: usize,
}

/// How long a new connection may take to send its first bytes.
const OPENING_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);
/// The HTTP/2 connection preface is 24 bytes.
const OPENING_BYTES: usize = 24;

impl Drop for Limited {
    fn drop(&mut self) {
        if let Ok(mut s) = self.settings.lock() {
            s.remove(&self.info.id);
        }
    }
}

impl AsyncRead for Limited {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(_) if buf.filled().len() > before => {
                self.received += buf.filled().len() - before;
                if self.received >= OPENING_BYTES {
                    self.opening = None;
                }
            }
            Poll::Pending => {
                if let Some(deadline) = self.opening.as_mut()
                    && deadline.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client sent nothing",
                    )));
                }
            }
            Poll::Ready(_) => {}
        }
        polled
    }
}

impl AsyncWrite for Limited {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Connected for Limited {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info
    }
}

/// Accepted connections, at most as many open at once as `permits` has.
pub fn incoming(
    listener: TcpListener,
    permits: Arc<Semaphore>,
    max: usize,
    settings: ConnectionSessions,
) -> impl Stream<Item = std::io::Result<Limited>> {
    futures::stream::unfold((listener, permits), move |(listener, permits)| {
        let settings = settings.clone();
        async move {
            loop {
                match listener.accept().await {
                    Ok((stream, peer)) => match permits.clone().try_acquire_owned() {
                        Ok(permit) => {
                            let _ = stream.set_nodelay(true);
                            let conn = Limited {
                                inner: stream,
                                _permit: permit,
                                info: ConnInfo {
                                    id: NEXT_CONNECTION.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                                },
                                settings,
                                opening: Some(Box::pin(tokio::time::sleep(OPENING_WITHIN))),
                                received: 0,
                            };
                            if let Ok(mut s) = conn.settings.lock() {
                                s.insert(conn.info.id, None);
                            }
                            return Some((Ok(conn), (listener, permits)));
                        }
                        Err(_) => {
                            tracing::warn!(
                                "refused a connection from {peer}: {max} connections are open (--max-connections)"
                            );
                        }
                    },
                    Err(e) => {
                        // Out of file descriptors and the like: back off a
                        // little rather than spin, and keep serving.
                        tracing::warn!("accepting a connection failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
        }
    })
}
