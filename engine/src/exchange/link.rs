//! One TCP connection between two worker processes, carrying many logical
//! channels (one per upstream subtask → downstream subtask of an edge) in
//! both directions, each with credit-based flow control as Flink's
//! network stack has it: a receiver grants credits for the messages it
//! can buffer and grants more as they are taken; a sender sends only with
//! a credit. So a slow receiving subtask stalls only the channels into it,
//! never the connection its siblings share (RisingWave's lesson: the
//! transport's own flow control alone deadlocks a streaming exchange).
//!
//! Messages of a channel arrive in the order they were sent (one TCP
//! stream, one writer). The connection failing closes every channel: a
//! receiver then ends without `EndOfInput`, which the input gate already
//! reads as "the upstream task stopped" and the job fails over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc, watch};

use super::frame::{self, Frame, FrameError, HEADER};
use crate::message::StreamMessage;

/// Why a channel of a link cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The connection to worker `peer` failed or was closed.
    #[error("the connection to worker {peer} is lost: {reason}")]
    Lost { peer: u32, reason: String },
    /// The peer sent what the protocol does not allow.
    #[error("worker {peer} broke the exchange protocol: {reason}")]
    Protocol { peer: u32, reason: String },
    #[error("channel {channel} is already open on the connection to worker {peer}")]
    Duplicate { peer: u32, channel: u32 },
}

/// An incoming channel: where its messages go, and the credits granted
/// that the peer has not used yet (a message beyond them is a protocol
/// error).
type Inbound = (mpsc::UnboundedSender<StreamMessage>, Arc<AtomicI64>);

/// The state the connection's reader and writer share with the channels.
struct Shared {
    peer: u32,
    /// Outgoing channels: the credits granted and not yet used, and
    /// whether this side opened the channel yet (the peer may open its
    /// receiving end, and grant credits, first: workers wire their
    /// channels each in its own time).
    credits: Mutex<HashMap<u32, (Arc<Semaphore>, bool)>>,
    /// Incoming channels.
    inbound: Mutex<HashMap<u32, Inbound>>,
    /// Set once when the connection fails.
    failed: watch::Sender<Option<LinkError>>,
    /// Where control frames go, in order; dropped when the connection
    /// fails (the reader then sees what came before, then the end).
    control: Mutex<Option<mpsc::UnboundedSender<Vec<u8>>>>,
    /// Told when the writer has flushed and shut down after a close.
    closing: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    /// When a frame last came from the peer (ms since `born`).
    heard_ms: AtomicI64,
    born: std::time::Instant,
    /// How long the peer may be silent before the connection counts as
    /// lost (ms): a stopped or hung process, or a network cut, sends no
    /// heartbeat though its socket stays open.
    silence_ms: AtomicI64,
}

/// How often a link sends a heartbeat.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_millis(500);

/// The default of [`Link::set_heartbeat_timeout`].
pub const HEARTBEAT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Shared {
    fn fail(&self, e: LinkError) {
        self.failed.send_if_modified(|f| {
            if f.is_some() {
                return false;
            }
            *f = Some(e);
            true
        });
        // Senders waiting for credits wake with an error; receivers end.
        for (s, _) in lock(&self.credits).values() {
            s.close();
        }
        lock(&self.inbound).clear();
        lock(&self.control).take();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection to one peer worker.
pub struct Link {
    shared: Arc<Shared>,
    /// Encoded frames for the writer.
    out: mpsc::UnboundedSender<Vec<u8>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The control frames received, until taken.
    control: Mutex<Option<mpsc::UnboundedReceiver<Vec<u8>>>>,
}

impl Drop for Link {
    fn drop(&mut self) {
        // Channels still held end too: a sender waiting for a credit
        // would otherwise wait for good.
        self.shared.fail(LinkError::Lost {
            peer: self.shared.peer,
            reason: "the connection was closed here".into(),
        });
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Link {
    /// Connects to the worker listening at `addr` as worker `me` of the
    /// job whose plan hashes to `plan`; `peer` is its index.
    pub async fn connect(addr: &str, me: u32, plan: u64, peer: u32) -> Result<Link, LinkError> {
        Self::connect_with(addr, me, plan, peer, None).await
    }

    /// [`Link::connect`], over TLS when `tls` is given.
    pub async fn connect_with(
        addr: &str,
        me: u32,
        plan: u64,
        peer: u32,
        tls: Option<&super::tls::LinkTls>,
    ) -> Result<Link, LinkError> {
        let lost = |e: std::io::Error| LinkError::Lost {
            peer,
            reason: format!("{addr}: {e}"),
        };
        let stream = TcpStream::connect(addr).await.map_err(lost)?;
        stream.set_nodelay(true).map_err(lost)?;
        let mut hello = vec![];
        frame::encode(0, &Frame::Hello { worker: me, plan }, &mut hello).map_err(|e| LinkError::Protocol {
            peer,
            reason: e.to_string(),
        })?;
        let (read, mut write): (Reader, Writer) = match tls {
            None => {
                let (r, w) = stream.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(tls) => {
                let name =
                    super::tls::LinkTls::server_name(addr).map_err(|reason| LinkError::Protocol { peer, reason })?;
                let s = tls.connector.connect(name, stream).await.map_err(|e| LinkError::Lost {
                    peer,
                    reason: format!("{addr}: TLS: {e}"),
                })?;
                let (r, w) = tokio::io::split(s);
                (Box::new(r), Box::new(w))
            }
        };
        write.write_all(&hello).await.map_err(lost)?;
        write.flush().await.map_err(lost)?;
        Ok(Self::start(read, write, peer))
    }

    /// The link of a connection a peer opened: its first frame names the
    /// peer. Returns the peer's index and plan hash with the link.
    pub async fn accept(stream: TcpStream) -> Result<(u32, u64, Link), LinkError> {
        Self::accept_with(stream, None).await
    }

    /// [`Link::accept`], over TLS when `tls` is given (the peer must
    /// present a certificate the CA signed).
    pub async fn accept_with(
        stream: TcpStream,
        tls: Option<&super::tls::LinkTls>,
    ) -> Result<(u32, u64, Link), LinkError> {
        let unknown = u32::MAX;
        stream.set_nodelay(true).map_err(|e| LinkError::Lost {
            peer: unknown,
            reason: e.to_string(),
        })?;
        let (mut read, write): (Reader, Writer) = match tls {
            None => {
                let (r, w) = stream.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(tls) => {
                let s = tls.acceptor.accept(stream).await.map_err(|e| LinkError::Protocol {
                    peer: unknown,
                    reason: format!("TLS: {e}"),
                })?;
                let (r, w) = tokio::io::split(s);
                (Box::new(r), Box::new(w))
            }
        };
        let (channel, kind, payload) = read_frame(&mut read, unknown).await?;
        match frame::decode(channel, kind, &payload) {
            Ok(Frame::Hello { worker, plan }) => Ok((worker, plan, Self::start(read, write, worker))),
            Ok(other) => Err(LinkError::Protocol {
                peer: unknown,
                reason: format!("the first frame is not a hello: {other:?}"),
            }),
            Err(e) => Err(LinkError::Protocol {
                peer: unknown,
                reason: e.to_string(),
            }),
        }
    }

    fn start(read: Reader, write: Writer, peer: u32) -> Link {
        let (failed, _) = watch::channel(None);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            peer,
            credits: Mutex::new(HashMap::new()),
            inbound: Mutex::new(HashMap::new()),
            failed,
            control: Mutex::new(Some(control_tx)),
            closing: Mutex::new(None),
            heard_ms: AtomicI64::new(0),
            born: std::time::Instant::now(),
            silence_ms: AtomicI64::new(HEARTBEAT_TIMEOUT.as_millis() as i64),
        });
        let (out, queue) = mpsc::unbounded_channel();
        let tasks = vec![
            tokio::spawn(write_frames(write, queue, shared.clone())),
            tokio::spawn(read_frames(read, shared.clone())),
            tokio::spawn(heartbeat(out.clone(), shared.clone())),
        ];
        Link {
            shared,
            out,
            tasks,
            control: Mutex::new(Some(control_rx)),
        }
    }

    /// The peer's worker index.
    pub fn peer(&self) -> u32 {
        self.shared.peer
    }

    /// The sending end of `channel` (the peer opens its receiving end).
    pub fn sender(&self, channel: u32) -> Result<RemoteSender, LinkError> {
        let mut map = lock(&self.shared.credits);
        let (credits, opened) = map
            .entry(channel)
            .or_insert_with(|| (Arc::new(Semaphore::new(0)), false));
        if *opened {
            return Err(LinkError::Duplicate {
                peer: self.shared.peer,
                channel,
            });
        }
        *opened = true;
        let credits = credits.clone();
        drop(map);
        if self.shared.failed.borrow().is_some() {
            credits.close();
        }
        Ok(RemoteSender {
            channel,
            credits,
            out: self.out.clone(),
            shared: self.shared.clone(),
        })
    }

    /// The receiving end of `channel`, buffering up to `credits` messages:
    /// the sender may send that many before it hears more.
    pub fn receiver(&self, channel: u32, credits: u32) -> Result<RemoteReceiver, LinkError> {
        let credits = credits.max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        let granted = Arc::new(AtomicI64::new(0));
        {
            let mut map = lock(&self.shared.inbound);
            if map.contains_key(&channel) {
                return Err(LinkError::Duplicate {
                    peer: self.shared.peer,
                    channel,
                });
            }
            if self.shared.failed.borrow().is_none() {
                map.insert(channel, (tx, granted.clone()));
            }
        }
        let r = RemoteReceiver {
            channel,
            rx,
            out: self.out.clone(),
            granted,
            taken: 0,
            // Credits go back in batches of half the buffer (one frame per
            // message would double the frames on a busy channel).
            return_at: credits.div_ceil(2),
        };
        r.grant(credits);
        Ok(r)
    }

    /// The error the connection failed with, if it did.
    pub fn failure(&self) -> Option<LinkError> {
        self.shared.failed.borrow().clone()
    }

    /// How long the peer may send nothing (not even a heartbeat) before
    /// the connection counts as lost.
    pub fn set_heartbeat_timeout(&self, timeout: std::time::Duration) {
        self.shared
            .silence_ms
            .store(timeout.as_millis().max(1) as i64, Ordering::Relaxed);
    }

    /// Writes out what is queued, then closes the sending side (the peer
    /// reads everything sent, then the end). Bounded: a peer that does not
    /// read is not waited for beyond 10 s.
    pub async fn close(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        *lock(&self.shared.closing) = Some(tx);
        // An empty frame is the writer's signal to flush and shut down.
        if self.out.send(Vec::new()).is_ok() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), rx).await;
        }
    }

    /// The connection's failure as it is when called (for a bridge
    /// that must say why its channel ended).
    pub fn failure_probe(&self) -> impl Fn() -> Option<LinkError> + Send + Sync + 'static {
        let failed = self.shared.failed.subscribe();
        move || failed.borrow().clone()
    }

    /// Waits until the connection fails, and says why.
    pub fn failed(&self) -> impl std::future::Future<Output = LinkError> + Send + 'static {
        let mut failed = self.shared.failed.subscribe();
        let peer = self.shared.peer;
        async move {
            match failed.wait_for(Option::is_some).await {
                Ok(f) => f.clone().unwrap_or_else(|| LinkError::Lost {
                    peer,
                    reason: "the connection was closed".into(),
                }),
                Err(_) => LinkError::Lost {
                    peer,
                    reason: "the connection was closed here".into(),
                },
            }
        }
    }

    /// Sends a control-plane message (no credits: the control plane is
    /// a few small messages per checkpoint).
    pub fn send_control(&self, payload: Vec<u8>) -> Result<(), LinkError> {
        let lost = || {
            self.failure().unwrap_or_else(|| LinkError::Lost {
                peer: self.shared.peer,
                reason: "the connection was closed".into(),
            })
        };
        if self.shared.failed.borrow().is_some() {
            return Err(lost());
        }
        let mut bytes = vec![];
        frame::encode(CONTROL_CHANNEL, &Frame::Control(payload), &mut bytes).map_err(|e| LinkError::Protocol {
            peer: self.shared.peer,
            reason: e.to_string(),
        })?;
        self.out.send(bytes).map_err(|_| lost())
    }

    /// The control-plane messages from the peer, in order (once: `None`
    /// when taken before). It ends when the connection does.
    pub fn take_control(&self) -> Option<mpsc::UnboundedReceiver<Vec<u8>>> {
        lock(&self.control).take()
    }
}

/// Credits a channel may hold unused: more is a broken peer (and would
/// overflow the semaphore).
const MAX_CREDITS: usize = 1 << 20;

/// The reading and writing halves of a connection (plain TCP or TLS).
type Reader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
type Writer = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// The channel id control frames carry (data channels count from 0).
pub const CONTROL_CHANNEL: u32 = u32::MAX;

/// The sending end of a logical channel.
pub struct RemoteSender {
    channel: u32,
    credits: Arc<Semaphore>,
    out: mpsc::UnboundedSender<Vec<u8>>,
    shared: Arc<Shared>,
}

impl RemoteSender {
    /// Sends `message` once the receiver has room for it.
    pub async fn send(&self, message: StreamMessage) -> Result<(), LinkError> {
        match self.credits.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => return Err(self.lost()),
        }
        let mut bytes = vec![];
        frame::encode(self.channel, &Frame::Message(message), &mut bytes).map_err(|e| self.protocol(e))?;
        self.out.send(bytes).map_err(|_| self.lost())
    }

    /// The worker at the other end.
    pub fn peer(&self) -> u32 {
        self.shared.peer
    }

    /// Credits this end may still use without waiting.
    pub fn available(&self) -> usize {
        self.credits.available_permits()
    }

    fn lost(&self) -> LinkError {
        self.shared.failed.borrow().clone().unwrap_or_else(|| LinkError::Lost {
            peer: self.shared.peer,
            reason: "the connection was closed".into(),
        })
    }

    fn protocol(&self, e: FrameError) -> LinkError {
        LinkError::Protocol {
            peer: self.shared.peer,
            reason: e.to_string(),
        }
    }
}

/// The receiving end of a logical channel.
pub struct RemoteReceiver {
    channel: u32,
    rx: mpsc::UnboundedReceiver<StreamMessage>,
    out: mpsc::UnboundedSender<Vec<u8>>,
    granted: Arc<AtomicI64>,
    /// Messages taken since credits were last returned.
    taken: u32,
    return_at: u32,
}

impl RemoteReceiver {
    /// The next message; `None` when the connection is gone (a message
    /// stream that ended normally ends with `EndOfInput` first).
    pub async fn recv(&mut self) -> Option<StreamMessage> {
        let m = self.rx.recv().await?;
        self.taken += 1;
        if self.taken >= self.return_at {
            self.grant(self.taken);
            self.taken = 0;
        }
        Some(m)
    }

    fn grant(&self, n: u32) {
        self.granted.fetch_add(i64::from(n), Ordering::AcqRel);
        let mut bytes = vec![];
        if frame::encode(self.channel, &Frame::Credit(n), &mut bytes).is_ok() {
            // A closed connection: nothing more will come anyway.
            let _ = self.out.send(bytes);
        }
    }
}

/// Reads one frame: its channel, kind and payload.
async fn read_frame(r: &mut (impl AsyncReadExt + Unpin), peer: u32) -> Result<(u32, u8, Vec<u8>), LinkError> {
    let mut head = [0u8; HEADER];
    r.read_exact(&mut head).await.map_err(|e| LinkError::Lost {
        peer,
        reason: e.to_string(),
    })?;
    let (channel, kind, len) = frame::header(&head).map_err(|e| LinkError::Protocol {
        peer,
        reason: e.to_string(),
    })?;
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).await.map_err(|e| LinkError::Lost {
        peer,
        reason: e.to_string(),
    })?;
    Ok((channel, kind, payload))
}

/// Sends a heartbeat every [`HEARTBEAT`], and fails the connection when
/// the peer has been silent longer than its timeout.
async fn heartbeat(out: mpsc::UnboundedSender<Vec<u8>>, shared: Arc<Shared>) {
    let mut ping = vec![];
    if frame::encode(CONTROL_CHANNEL, &Frame::Ping, &mut ping).is_err() {
        return;
    }
    let mut failed = shared.failed.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(HEARTBEAT) => {}
            _ = failed.wait_for(Option::is_some) => return,
        }
        if out.send(ping.clone()).is_err() {
            return;
        }
        let now = shared.born.elapsed().as_millis() as i64;
        let silent = now - shared.heard_ms.load(Ordering::Relaxed);
        if silent > shared.silence_ms.load(Ordering::Relaxed) {
            shared.fail(LinkError::Lost {
                peer: shared.peer,
                reason: format!(
                    "nothing heard for {silent} ms, not even a heartbeat (the worker is stopped, hung, or cut off)"
                ),
            });
            return;
        }
    }
}

async fn read_frames(mut read: Reader, shared: Arc<Shared>) {
    let peer = shared.peer;
    let protocol = |reason: String| LinkError::Protocol { peer, reason };
    let failure = loop {
        let (channel, kind, payload) = match read_frame(&mut read, peer).await {
            Ok(f) => f,
            Err(e) => break e,
        };
        shared
            .heard_ms
            .store(shared.born.elapsed().as_millis() as i64, Ordering::Relaxed);
        match frame::decode(channel, kind, &payload) {
            Ok(Frame::Credit(n)) => {
                // Before this side opened the channel: kept for it.
                let mut map = lock(&shared.credits);
                let (s, _) = map
                    .entry(channel)
                    .or_insert_with(|| (Arc::new(Semaphore::new(0)), false));
                if s.available_permits().saturating_add(n as usize) > MAX_CREDITS {
                    break protocol(format!("more than {MAX_CREDITS} credits on channel {channel}"));
                }
                s.add_permits(n as usize);
            }
            Ok(Frame::Message(m)) => {
                let map = lock(&shared.inbound);
                let Some((tx, granted)) = map.get(&channel) else {
                    break protocol(format!("a message on channel {channel}, which has no receiver"));
                };
                if granted.fetch_sub(1, Ordering::AcqRel) <= 0 {
                    break protocol(format!("a message on channel {channel} without a credit"));
                }
                // A receiver dropped by its consumer: nothing to deliver to.
                let _ = tx.send(m);
            }
            Ok(Frame::Hello { .. }) => break protocol("a second hello".into()),
            Ok(Frame::Ping) => {}
            Ok(Frame::Control(bytes)) => {
                if let Some(tx) = lock(&shared.control).as_ref() {
                    // Taken and dropped: nobody listens, nothing to do.
                    let _ = tx.send(bytes);
                }
            }
            Err(e) => break protocol(e.to_string()),
        }
    };
    shared.fail(failure);
}

async fn write_frames(write: Writer, mut queue: mpsc::UnboundedReceiver<Vec<u8>>, shared: Arc<Shared>) {
    let mut w = BufWriter::with_capacity(256 << 10, write);
    let mut failed = shared.failed.subscribe();
    loop {
        let next = tokio::select! {
            f = queue.recv() => f,
            _ = failed.changed() => None,
        };
        let Some(bytes) = next else { break };
        let mut closing = bytes.is_empty();
        let mut result = w.write_all(&bytes).await;
        // Everything queued goes out in one flush.
        while result.is_ok()
            && !closing
            && let Ok(more) = queue.try_recv()
        {
            closing = more.is_empty();
            result = w.write_all(&more).await;
        }
        if let Err(e) = result.and(w.flush().await) {
            shared.fail(LinkError::Lost {
                peer: shared.peer,
                reason: e.to_string(),
            });
            return;
        }
        if closing {
            break;
        }
    }
    let _ = w.shutdown().await;
    if let Some(tx) = lock(&shared.closing).take() {
        let _ = tx.send(());
    }
}

/// Two linked workers on loopback (0 connected to 1), for tests.
#[cfg(test)]
pub(crate) async fn pair() -> (Link, Link) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let accepted = tokio::spawn(async move {
        let (s, _) = listener.accept().await.expect("accept");
        Link::accept(s).await.expect("hello")
    });
    let a = Link::connect(&addr, 0, 9, 1).await.expect("connect");
    let (peer, _, b) = accepted.await.expect("join");
    assert_eq!(peer, 0);
    (a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Barrier, BarrierKind};
    use futures::FutureExt;

    fn watermark(m: Option<StreamMessage>) -> i64 {
        match m {
            Some(StreamMessage::Watermark(w)) => w,
            other => panic!("not a watermark: {other:?}"),
        }
    }

    /// A receiver that takes nothing stalls its own channel after its
    /// credits, and only it: a sibling channel on the same connection
    /// carries everything meanwhile; in order, once taken.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_channel_does_not_stall_its_sibling() {
        let (a, b) = pair().await;
        let (slow_tx, fast_tx) = (a.sender(0).expect("sender"), a.sender(1).expect("sender"));
        let mut slow_rx = b.receiver(0, 2).expect("receiver");
        let mut fast_rx = b.receiver(1, 2).expect("receiver");
        // The slow channel: two messages go (its credits), the third waits.
        slow_tx.send(StreamMessage::Watermark(0)).await.expect("send");
        slow_tx.send(StreamMessage::Watermark(1)).await.expect("send");
        assert_eq!(slow_tx.available(), 0);
        let third = slow_tx.send(StreamMessage::Watermark(2));
        tokio::pin!(third);
        assert!((&mut third).now_or_never().is_none(), "sent without a credit");
        // The fast channel carries 1000 messages past it.
        let sender = tokio::spawn(async move {
            for i in 0..1000 {
                fast_tx.send(StreamMessage::Watermark(i)).await.expect("send");
            }
            fast_tx.send(StreamMessage::EndOfInput).await.expect("send");
        });
        for i in 0..1000 {
            assert_eq!(watermark(fast_rx.recv().await), i);
        }
        assert!(matches!(fast_rx.recv().await, Some(StreamMessage::EndOfInput)));
        sender.await.expect("fast sender");
        // The slow receiver takes its messages: the third goes, in order.
        assert_eq!(watermark(slow_rx.recv().await), 0);
        third.await.expect("third send");
        assert_eq!(watermark(slow_rx.recv().await), 1);
        assert_eq!(watermark(slow_rx.recv().await), 2);
        // Both directions on one connection.
        let back = b.sender(7).expect("sender");
        let mut back_rx = a.receiver(7, 4).expect("receiver");
        let barrier = Barrier {
            checkpoint_id: 3,
            timestamp: 5,
            kind: BarrierKind::Checkpoint,
        };
        back.send(StreamMessage::Barrier(barrier)).await.expect("send");
        assert!(matches!(back_rx.recv().await, Some(StreamMessage::Barrier(b)) if b == barrier));
        assert!(matches!(a.receiver(7, 1), Err(LinkError::Duplicate { channel: 7, .. })));
    }

    /// The connection lost: receivers end without `EndOfInput`, senders
    /// waiting for credits fail naming the peer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_connection_ends_every_channel() {
        let (a, b) = pair().await;
        let tx = a.sender(0).expect("sender");
        let mut rx = b.receiver(0, 1).expect("receiver");
        tx.send(StreamMessage::Watermark(1)).await.expect("send");
        assert_eq!(watermark(rx.recv().await), 1);
        let blocked = tokio::spawn(async move { tx.send(StreamMessage::Watermark(2)).await });
        drop(a);
        // Sent before the drop (with the credit the first one returned),
        // or failed naming the lost connection: never stuck.
        if let Err(e) = blocked.await.expect("join") {
            assert!(matches!(e, LinkError::Lost { peer: 1, .. }), "{e}");
        }
        let mut seen = vec![];
        while let Some(m) = rx.recv().await {
            seen.push(m);
        }
        assert!(seen.iter().all(|m| !matches!(m, StreamMessage::EndOfInput)), "{seen:?}");
        assert!(b.failure().is_some());
    }

    /// Bytes that are not the protocol fail the connection with an error,
    /// never a panic; a message beyond the credits granted too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_breaking_the_protocol_is_refused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut raw = TcpStream::connect(addr).await.expect("connect");
        let (s, _) = listener.accept().await.expect("accept");
        raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        assert!(matches!(Link::accept(s).await, Err(LinkError::Protocol { .. })));
        // A hello, then two messages on a channel granted one credit.
        let mut raw = TcpStream::connect(addr).await.expect("connect");
        let (s, _) = listener.accept().await.expect("accept");
        let mut hello = vec![];
        frame::encode(0, &Frame::Hello { worker: 5, plan: 1 }, &mut hello).expect("hello");
        raw.write_all(&hello).await.expect("write");
        let (peer, _, link) = Link::accept(s).await.expect("hello");
        assert_eq!(peer, 5);
        let _rx = link.receiver(3, 1).expect("receiver");
        let mut bytes = vec![];
        frame::encode(3, &Frame::Message(StreamMessage::EndOfInput), &mut bytes).expect("frame");
        frame::encode(3, &Frame::Message(StreamMessage::EndOfInput), &mut bytes).expect("frame");
        raw.write_all(&bytes).await.expect("write");
        // Nothing is taken, so no credit comes back: the second is refused.
        let failure = tokio::time::timeout(std::time::Duration::from_secs(10), link.failed())
            .await
            .expect("no protocol error within 10 s");
        assert!(
            matches!(&failure, LinkError::Protocol { peer: 5, reason } if reason.contains("without a credit")),
            "{failure}"
        );
    }

    #[tokio::test]
    async fn control_messages_arrive_in_order_beside_data_and_end_with_the_connection() {
        let (a, b) = pair().await;
        let mut control = b.take_control().expect("control");
        assert!(b.take_control().is_none(), "taken once");
        let _rx = b.receiver(0, 1).expect("receiver");
        let tx = a.sender(0).expect("sender");
        a.send_control(b"one".to_vec()).expect("send");
        tx.send(StreamMessage::EndOfInput).await.expect("data");
        a.send_control(b"two".to_vec()).expect("send");
        assert_eq!(control.recv().await.as_deref(), Some(&b"one"[..]));
        assert_eq!(control.recv().await.as_deref(), Some(&b"two"[..]));
        drop(a);
        // Queued messages first, then the end.
        assert_eq!(control.recv().await, None);
        let lost = tokio::time::timeout(std::time::Duration::from_secs(10), b.failed())
            .await
            .expect("no failure within 10 s");
        assert!(matches!(lost, LinkError::Lost { peer: 0, .. }), "{lost}");
    }

    #[tokio::test]
    async fn a_peer_that_says_nothing_is_lost_after_the_heartbeat_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        // A peer that says hello, then nothing (a stopped process keeps
        // its socket open).
        let mut raw = TcpStream::connect(addr).await.expect("connect");
        let (s, _) = listener.accept().await.expect("accept");
        let mut hello = vec![];
        frame::encode(0, &Frame::Hello { worker: 2, plan: 1 }, &mut hello).expect("hello");
        raw.write_all(&hello).await.expect("write");
        let (_, _, link) = Link::accept(s).await.expect("hello");
        link.set_heartbeat_timeout(std::time::Duration::from_millis(300));
        let lost = tokio::time::timeout(std::time::Duration::from_secs(10), link.failed())
            .await
            .expect("no failure within 10 s");
        assert!(
            matches!(&lost, LinkError::Lost { peer: 2, reason } if reason.contains("heartbeat")),
            "{lost}"
        );
        // A live peer's heartbeats keep a link up past the timeout.
        let (a, b) = pair().await;
        a.set_heartbeat_timeout(std::time::Duration::from_millis(1200));
        b.set_heartbeat_timeout(std::time::Duration::from_millis(1200));
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(2500), a.failed()).await;
        assert!(quiet.is_err(), "a live link failed: {:?}", a.failure());
    }
}
