//! A cap on concurrent connections: the listener hands tonic only
//! connections that got a permit; one over the cap is closed at once and
//! logged (the client sees UNAVAILABLE and may retry).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Future, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// `SET` options per client connection (by its address).
pub type ConnectionSettings = Arc<std::sync::Mutex<HashMap<SocketAddr, BTreeMap<String, String>>>>;

/// A connection holding one of the cap's permits until it closes; its
/// `SET` options are forgotten then.
pub struct Limited {
    inner: TcpStream,
    _permit: OwnedSemaphorePermit,
    peer: SocketAddr,
    settings: ConnectionSettings,
    /// Until the client's first byte: a connection that says nothing is
    /// closed when this fires, so silent connections cannot hold every
    /// permit.
    first_byte: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// How long a new connection may stay silent.
const FIRST_BYTE_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

impl Drop for Limited {
    fn drop(&mut self) {
        if let Ok(mut s) = self.settings.lock() {
            s.remove(&self.peer);
        }
    }
}

impl AsyncRead for Limited {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(_) if buf.filled().len() > before => self.first_byte = None,
            Poll::Pending => {
                if let Some(deadline) = self.first_byte.as_mut()
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
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

/// Accepted connections, at most as many open at once as `permits` has.
pub fn incoming(
    listener: TcpListener,
    permits: Arc<Semaphore>,
    max: usize,
    settings: ConnectionSettings,
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
                                peer,
                                settings,
                                first_byte: Some(Box::pin(tokio::time::sleep(FIRST_BYTE_WITHIN))),
                            };
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
