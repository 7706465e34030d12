//! Authentication: when a password is configured, a client first sends
//! `Handshake` with `authorization: Basic base64(user:password)` and gets
//! a Bearer token back (in the response header and the handshake
//! payload); every other call carries `authorization: Bearer <token>` (a
//! call with valid Basic credentials is accepted too). Without a password
//! the server is open (meant for loopback).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::{DecodePaddingMode, general_purpose};
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

/// The Go ADBC driver sends Basic credentials without base64 padding.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// How long a token is good for unused; then the client handshakes again.
const TOKEN_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Most tokens kept; the oldest is forgotten first (its client handshakes
/// again on UNAUTHENTICATED).
const MAX_TOKENS: usize = 10_000;

/// Token -> when it was issued; and the tokens oldest first.
type Tokens = (HashMap<String, Instant>, std::collections::VecDeque<String>);

#[derive(Clone)]
pub struct Auth {
    credentials: Option<Arc<(String, String)>>,
    tokens: Arc<Mutex<Tokens>>,
}

impl Auth {
    /// `credentials`: (user, password), or `None` for an open server.
    pub fn new(credentials: Option<(String, String)>) -> Self {
        Self {
            credentials: credentials.map(Arc::new),
            tokens: Arc::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.credentials.is_some()
    }

    /// Checks `authorization: Basic ...` and answers with a new token.
    pub fn handshake(&self, metadata: &MetadataMap) -> Result<Option<String>, Status> {
        if !self.enabled() {
            return Ok(None);
        }
        match header(metadata)? {
            Some(h) if scheme(&h, "Basic ").is_some() => {
                self.check_basic(scheme(&h, "Basic ").unwrap_or_default())?;
                let token = secret_token()?;
                if let Ok(mut t) = self.tokens.lock() {
                    t.0.insert(token.clone(), Instant::now());
                    t.1.push_back(token.clone());
                    while t.1.len() > MAX_TOKENS {
                        if let Some(old) = t.1.pop_front() {
                            t.0.remove(&old);
                        }
                    }
                }
                Ok(Some(token))
            }
            _ => Err(Status::unauthenticated(
                "handshake needs 'authorization: Basic <base64 user:password>'",
            )),
        }
    }

    /// The interceptor every call goes through.
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        if !self.enabled() {
            return Ok(request);
        }
        match header(request.metadata())? {
            Some(h) if scheme(&h, "Bearer ").is_some() => {
                let token = scheme(&h, "Bearer ").unwrap_or_default().trim();
                // Expires after a day unused (drivers keep their token
                // for the connection's life).
                let fresh = self.tokens.lock().ok().is_some_and(|mut t| match t.0.get_mut(token) {
                    Some(last) if last.elapsed() < TOKEN_TTL => {
                        *last = Instant::now();
                        true
                    }
                    _ => false,
                });
                if fresh {
                    Ok(request)
                } else {
                    Err(Status::unauthenticated("unknown or expired token; handshake again"))
                }
            }
            Some(h) if scheme(&h, "Basic ").is_some() => {
                self.check_basic(scheme(&h, "Basic ").unwrap_or_default())?;
                Ok(request)
            }
            _ => Err(Status::unauthenticated(
                "this server needs a password: handshake with Basic credentials, then send the Bearer token",
            )),
        }
    }

    fn check_basic(&self, encoded: &str) -> Result<(), Status> {
        let bad = || Status::unauthenticated("invalid user or password");
        let decoded = LENIENT
            .decode(encoded.trim())
            .or_else(|_| general_purpose::URL_SAFE_NO_PAD.decode(encoded.trim()))
            .map_err(|_| Status::unauthenticated("Basic credentials are not base64"))?;
        let text = String::from_utf8(decoded).map_err(|_| bad())?;
        let (user, password) = text.split_once(':').ok_or_else(bad)?;
        match &self.credentials {
            Some(c) if constant_time_eq(user, &c.0) & constant_time_eq(password, &c.1) => Ok(()),
            _ => Err(bad()),
        }
    }
}

/// The credentials after an authorization scheme (matched without regard
/// to case, as HTTP says).
fn scheme<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    let head = header.get(..name.len())?;
    head.eq_ignore_ascii_case(name).then(|| &header[name.len()..])
}

/// 128 random bits from the OS, as hex: a Bearer token.
pub fn secret_token() -> Result<String, Status> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Status::internal(format!("cannot read /dev/urandom: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn header(metadata: &MetadataMap) -> Result<Option<String>, Status> {
    match metadata.get("authorization") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.to_string()))
            .map_err(|_| Status::unauthenticated("the authorization header is not text")),
    }
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The password from `WEIR_PASSWORD`, or else from the first line of the
/// file named by `password_file` (never from the command line).
pub fn load_password(password_file: Option<&std::path::Path>) -> Result<Option<String>, String> {
    if let Ok(p) = std::env::var("WEIR_PASSWORD")
        && !p.is_empty()
    {
        return Ok(Some(p));
    }
    let Some(path) = password_file else { return Ok(None) };
    let text = std::fs::read_to_string(path).map_err(|e| format!("--password-file {}: {e}", path.display()))?;
    match text.lines().next().map(str::trim) {
        Some(p) if !p.is_empty() => Ok(Some(p.to_string())),
        _ => Err(format!("--password-file {}: the first line is empty", path.display())),
    }
}
