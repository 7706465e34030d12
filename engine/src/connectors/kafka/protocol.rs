//! The few Kafka protocol requests librdkafka cannot make for us, over a
//! plain TCP connection (non-flexible request versions, so no tagged
//! fields):
//!
//! - `FindCoordinator` and `EndTxn`: committing, after a restart, a
//!   transaction that a previous process pre-committed. librdkafka can only
//!   end the transactions of its own producer instance; the transaction's
//!   id, producer id and epoch are in the checkpoint, and this is what the
//!   broker needs (Flink does the same through reflection into the Java
//!   producer).
//! - `Fetch` at `READ_UNCOMMITTED` with record batches parsed down to their
//!   producer ids and control records: the tests' verifier, which applies
//!   commit and abort markers itself (a test broker may not filter aborted
//!   records for `read_committed` readers).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A protocol-level failure: the broker's error code, or a broken exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// The broker answered with this Kafka error code.
    Code(i16),
    /// The connection or the answer was broken.
    Io(String),
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtocolError::Code(c) => write!(f, "Kafka error {c} ({})", error_name(*c)),
            ProtocolError::Io(m) => write!(f, "{m}"),
        }
    }
}

/// Names of the error codes these requests answer.
pub fn error_name(code: i16) -> &'static str {
    match code {
        0 => "NONE",
        7 => "REQUEST_TIMED_OUT",
        14 => "COORDINATOR_LOAD_IN_PROGRESS",
        15 => "COORDINATOR_NOT_AVAILABLE",
        16 => "NOT_COORDINATOR",
        47 => "INVALID_PRODUCER_EPOCH",
        48 => "INVALID_TXN_STATE",
        49 => "INVALID_PRODUCER_ID_MAPPING",
        51 => "CONCURRENT_TRANSACTIONS",
        53 => "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        90 => "PRODUCER_FENCED",
        _ => "see the Kafka protocol's error codes",
    }
}

impl ProtocolError {
    /// Worth asking again (the coordinator moves or is busy).
    pub fn is_retriable(&self) -> bool {
        matches!(self, ProtocolError::Io(_) | ProtocolError::Code(7 | 14 | 15 | 16 | 51))
    }
}

type Result<T> = std::result::Result<T, ProtocolError>;

fn io(e: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::Io(e.to_string())
}

/// A request body being written.
#[derive(Default)]
pub struct Writer(Vec<u8>);

impl Writer {
    pub fn i8(&mut self, v: i8) -> &mut Self {
        self.0.push(v as u8);
        self
    }
    pub fn i16(&mut self, v: i16) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn string(&mut self, s: &str) -> &mut Self {
        self.i16(s.len() as i16);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
}

/// A response being read; every read checks the bounds.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or_else(|| io(format!("a response cut short at byte {}", self.at)))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }
    pub fn i8(&mut self) -> Result<i8> {
        Ok(self.take(1)?[0] as i8)
    }
    pub fn i16(&mut self) -> Result<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    pub fn i32(&mut self) -> Result<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn i64(&mut self) -> Result<i64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }
    pub fn string(&mut self) -> Result<Option<String>> {
        let n = self.i16()?;
        if n < 0 {
            return Ok(None);
        }
        Ok(Some(String::from_utf8_lossy(self.take(n as usize)?).into_owned()))
    }
    pub fn bytes(&mut self) -> Result<Option<&'a [u8]>> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(None);
        }
        self.take(n as usize).map(Some)
    }
    /// A zig-zag varint (record fields).
    pub fn varint(&mut self) -> Result<i64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(((v >> 1) as i64) ^ -((v & 1) as i64));
            }
        }
        Err(io("a varint longer than 10 bytes"))
    }
    /// Varint-length bytes (record key, value); `None` for length -1.
    pub fn var_bytes(&mut self) -> Result<Option<&'a [u8]>> {
        let n = self.varint()?;
        if n < 0 {
            return Ok(None);
        }
        self.take(n as usize).map(Some)
    }
}

/// One connection to one broker.
pub struct Connection {
    stream: TcpStream,
    correlation: i32,
    address: String,
}

impl Connection {
    pub fn open(address: &str, timeout: Duration) -> Result<Self> {
        use std::net::ToSocketAddrs;
        let addr = address
            .to_socket_addrs()
            .map_err(|e| io(format!("'{address}': {e}")))?
            .next()
            .ok_or_else(|| io(format!("'{address}' has no address")))?;
        let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| io(format!("'{address}': {e}")))?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        Ok(Self {
            stream,
            correlation: 0,
            address: address.to_string(),
        })
    }

    /// Sends one request (header v1) and returns its response body.
    pub fn call(&mut self, api_key: i16, version: i16, body: &Writer) -> Result<Vec<u8>> {
        self.correlation += 1;
        let mut header = Writer::default();
        header.i16(api_key).i16(version).i32(self.correlation).string("weir");
        let size = (header.0.len() + body.0.len()) as i32;
        let mut frame = size.to_be_bytes().to_vec();
        frame.extend_from_slice(&header.0);
        frame.extend_from_slice(&body.0);
        // A broker that does not serve a request closes the connection.
        let broken = |e: std::io::Error| {
            io(format!(
                "request {api_key} v{version} to '{}' got no answer ({e}): the broker may not serve it",
                self.address
            ))
        };
        self.stream.write_all(&frame).map_err(broken)?;
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).map_err(broken)?;
        let len = i32::from_be_bytes(len);
        if !(4..=256 * 1024 * 1024).contains(&len) {
            return Err(io(format!("a response of {len} bytes")));
        }
        let mut response = vec![0u8; len as usize];
        self.stream.read_exact(&mut response).map_err(io)?;
        let mut r = Reader::new(&response);
        let correlation = r.i32()?;
        if correlation != self.correlation {
            return Err(io(format!(
                "a response to request {correlation}, expected {}",
                self.correlation
            )));
        }
        Ok(response[4..].to_vec())
    }
}

/// A connection to the first reachable server of `bootstrap` (`host:port`
/// separated by commas).
fn first_broker(bootstrap: &str, timeout: Duration) -> Result<Connection> {
    let mut last = io(format!("no bootstrap server in '{bootstrap}'"));
    for server in bootstrap.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match Connection::open(server, timeout) {
            Ok(c) => return Ok(c),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Whether the first reachable broker of `bootstrap` serves request
/// `api_key` (ApiVersions v0).
pub fn supports(bootstrap: &str, api_key: i16, timeout: Duration) -> Result<bool> {
    let mut c = first_broker(bootstrap, timeout)?;
    let response = c.call(18, 0, &Writer::default())?;
    let mut r = Reader::new(&response);
    let error = r.i16()?;
    if error != 0 {
        return Err(ProtocolError::Code(error));
    }
    for _ in 0..r.i32()? {
        let key = r.i16()?;
        let _min = r.i16()?;
        let _max = r.i16()?;
        if key == api_key {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The broker coordinating transactional id `id`, as `host:port`.
pub fn find_transaction_coordinator(bootstrap: &str, id: &str, timeout: Duration) -> Result<String> {
    let mut c = first_broker(bootstrap, timeout)?;
    let mut body = Writer::default();
    // FindCoordinator v1: key, key_type (1 = transaction).
    body.string(id).i8(1);
    let response = c.call(10, 1, &body)?;
    let mut r = Reader::new(&response);
    let _throttle = r.i32()?;
    let error = r.i16()?;
    let _message = r.string()?;
    let _node = r.i32()?;
    let host = r.string()?.unwrap_or_default();
    let port = r.i32()?;
    if error != 0 {
        return Err(ProtocolError::Code(error));
    }
    Ok(format!("{host}:{port}"))
}

/// Ends transaction `id` of producer `producer_id` at `epoch`: commits it
/// (`commit`) or aborts it. Asking again after it ended answers NONE.
pub fn end_transaction(
    bootstrap: &str,
    id: &str,
    producer_id: i64,
    epoch: i16,
    commit: bool,
    timeout: Duration,
) -> Result<()> {
    let coordinator = find_transaction_coordinator(bootstrap, id, timeout)?;
    let mut c = Connection::open(&coordinator, timeout)?;
    let mut body = Writer::default();
    // EndTxn v1: transactional_id, producer_id, producer_epoch, committed.
    body.string(id).i64(producer_id).i16(epoch).i8(commit as i8);
    let response = c.call(26, 1, &body)?;
    let mut r = Reader::new(&response);
    let _throttle = r.i32()?;
    match r.i16()? {
        0 => Ok(()),
        code => Err(ProtocolError::Code(code)),
    }
}

/// A record as stored, with what `read_committed` needs to judge it.
#[derive(Debug, Clone)]
pub struct StoredRecord {
    pub offset: i64,
    pub producer_id: i64,
    pub transactional: bool,
    /// A control record: `Some(true)` commits, `Some(false)` aborts the
    /// producer's open transaction.
    pub marker: Option<bool>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
}

/// The uncompressed record batches (format v2) of a fetch response.
fn parse_batches(mut records: &[u8], out: &mut Vec<StoredRecord>) -> Result<()> {
    while records.len() >= 12 {
        let mut h = Reader::new(records);
        let base_offset = h.i64()?;
        let length = h.i32()?;
        let total = 12 + length.max(0) as usize;
        if total > records.len() {
            // A partial batch at the end of a response (max bytes).
            return Ok(());
        }
        let mut b = Reader::new(&records[12..total]);
        let _leader_epoch = b.i32()?;
        let magic = b.i8()?;
        if magic != 2 {
            return Err(io(format!("record batch format {magic}, expected 2")));
        }
        let _crc = b.i32()?;
        let attributes = b.i16()?;
        if attributes & 0x7 != 0 {
            return Err(io("a compressed record batch (the verifier reads uncompressed ones)"));
        }
        let transactional = attributes & 0x10 != 0;
        let control = attributes & 0x20 != 0;
        let _last_delta = b.i32()?;
        let _base_ts = b.i64()?;
        let _max_ts = b.i64()?;
        let producer_id = b.i64()?;
        let _epoch = b.i16()?;
        let _base_sequence = b.i32()?;
        let count = b.i32()?;
        for _ in 0..count {
            let _len = b.varint()?;
            let _attrs = b.i8()?;
            let _ts_delta = b.varint()?;
            let offset_delta = b.varint()?;
            let key = b.var_bytes()?.map(<[u8]>::to_vec);
            let value = b.var_bytes()?.map(<[u8]>::to_vec);
            let headers = b.varint()?;
            for _ in 0..headers {
                b.var_bytes()?;
                b.var_bytes()?;
            }
            let marker = if control {
                // Control key: version INT16, type INT16 (0 abort, 1 commit).
                let k = key.as_deref().unwrap_or_default();
                Some(k.len() >= 4 && i16::from_be_bytes([k[2], k[3]]) == 1)
            } else {
                None
            };
            out.push(StoredRecord {
                offset: base_offset + offset_delta,
                producer_id,
                transactional,
                marker,
                key,
                value,
            });
        }
        records = &records[total..];
    }
    Ok(())
}

/// Every record of one partition from `from`, uncommitted ones included
/// (Fetch v4 at READ_UNCOMMITTED), up to its high watermark.
pub fn fetch_all(
    address: &str,
    topic: &str,
    partition: i32,
    from: i64,
    timeout: Duration,
) -> Result<Vec<StoredRecord>> {
    let mut c = Connection::open(address, timeout)?;
    let mut out: Vec<StoredRecord> = vec![];
    let mut next = from;
    loop {
        let mut body = Writer::default();
        body.i32(-1).i32(100).i32(1).i32(4 * 1024 * 1024).i8(0);
        body.i32(1)
            .string(topic)
            .i32(1)
            .i32(partition)
            .i64(next)
            .i32(4 * 1024 * 1024);
        let response = c.call(1, 4, &body)?;
        let mut r = Reader::new(&response);
        let _throttle = r.i32()?;
        let mut high = next;
        let mut got = vec![];
        for _ in 0..r.i32()? {
            let _topic = r.string()?;
            for _ in 0..r.i32()? {
                let _p = r.i32()?;
                let error = r.i16()?;
                high = r.i64()?;
                let _lso = r.i64()?;
                let aborted = r.i32()?;
                for _ in 0..aborted.max(0) {
                    r.i64()?;
                    r.i64()?;
                }
                let records = r.bytes()?.unwrap_or_default();
                if error != 0 {
                    return Err(ProtocolError::Code(error));
                }
                parse_batches(records, &mut got)?;
            }
        }
        got.retain(|r| r.offset >= next);
        match got.last() {
            Some(last) => next = last.offset + 1,
            None if next >= high => break,
            // Nothing parsed below the high watermark: a batch larger than
            // the fetch, or the end.
            None => {
                return Err(io(format!(
                    "no record at offset {next} below the high watermark {high}"
                )));
            }
        }
        out.extend(got);
        if next >= high {
            break;
        }
    }
    Ok(out)
}

/// What `read_committed` readers see: records of committed transactions
/// and non-transactional records, in offset order; and the transactional
/// records of transactions still open at the end.
pub fn committed(records: &[StoredRecord]) -> (Vec<StoredRecord>, usize) {
    use std::collections::HashMap;
    let mut open: HashMap<i64, Vec<StoredRecord>> = HashMap::new();
    let mut out = vec![];
    for r in records {
        match (r.marker, r.transactional) {
            (Some(commit), _) => {
                let txn = open.remove(&r.producer_id).unwrap_or_default();
                if commit {
                    out.extend(txn);
                }
            }
            (None, true) => open.entry(r.producer_id).or_default().push(r.clone()),
            (None, false) => out.push(r.clone()),
        }
    }
    out.sort_by_key(|r| r.offset);
    (out, open.values().map(Vec::len).sum())
}
