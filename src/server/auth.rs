//! Authentication: when a password is configured, a client first sends
//! `Handshake` with `authorization: Basic base64(user:password)` and gets
//! a Bearer token back (in the response header and the handshake
//! payload); every other call carries `authorization: Bearer <token>` (a
//! call with valid Basic credentials is accepted too). Without a password
//! the server is open (meant for loopback) and every client is the local
//! admin.
//!
//! Several users come from a users file: one `user:role:password` per
//! line (roles `admin`, `user`, `read`; `#` comments). A file of one line
//! without `:` is a lone password for `--user` (an admin). The interceptor
//! puts the caller's [`Principal`] in the request's extensions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::{DecodePaddingMode, general_purpose};
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::access::{Principal, Role};

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

/// Token -> (last used, whose); and the tokens oldest first.
type Tokens = (
    HashMap<String, (Instant, Principal)>,
    std::collections::VecDeque<String>,
);

/// One user of a users file.
#[derive(Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub password: String,
    pub role: Role,
}

/// Never the password.
impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("password", &"******")
            .field("role", &self.role)
            .finish()
    }
}

#[derive(Clone)]
pub struct Auth {
    /// Empty: an open server.
    users: Arc<Vec<User>>,
    tokens: Arc<Mutex<Tokens>>,
}

impl Auth {
    /// `users`: who may connect; none for an open server.
    pub fn new(users: Vec<User>) -> Self {
        Self {
            users: Arc::new(users),
            tokens: Arc::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.users.is_empty()
    }

    /// Checks `authorization: Basic ...` and answers with a new token.
    pub fn handshake(&self, metadata: &MetadataMap) -> Result<Option<String>, Status> {
        if !self.enabled() {
            return Ok(None);
        }
        match header(metadata)? {
            Some(h) if scheme(&h, "Basic ").is_some() => {
                let principal = self.check_basic(scheme(&h, "Basic ").unwrap_or_default())?;
                let token = secret_token()?;
                if let Ok(mut t) = self.tokens.lock() {
                    t.0.insert(token.clone(), (Instant::now(), principal));
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

    /// The interceptor every call goes through: it puts the caller's
    /// [`Principal`] in the request's extensions.
    pub fn check(&self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if !self.enabled() {
            request.extensions_mut().insert(Principal::local());
            return Ok(request);
        }
        let principal = match header(request.metadata())? {
            Some(h) if scheme(&h, "Bearer ").is_some() => {
                let token = scheme(&h, "Bearer ").unwrap_or_default().trim();
                // Expires after a day unused (drivers keep their token
                // for the connection's life).
                let fresh = self.tokens.lock().ok().and_then(|mut t| match t.0.get_mut(token) {
                    Some((last, who)) if last.elapsed() < TOKEN_TTL => {
                        *last = Instant::now();
                        Some(who.clone())
                    }
                    _ => None,
                });
                fresh.ok_or_else(|| Status::unauthenticated("unknown or expired token; handshake again"))?
            }
            Some(h) if scheme(&h, "Basic ").is_some() => self.check_basic(scheme(&h, "Basic ").unwrap_or_default())?,
            _ => {
                return Err(Status::unauthenticated(
                    "this server needs a password: handshake with Basic credentials, then send the Bearer token",
                ));
            }
        };
        request.extensions_mut().insert(principal);
        Ok(request)
    }

    fn check_basic(&self, encoded: &str) -> Result<Principal, Status> {
        let bad = || Status::unauthenticated("invalid user or password");
        let decoded = LENIENT
            .decode(encoded.trim())
            .or_else(|_| general_purpose::URL_SAFE_NO_PAD.decode(encoded.trim()))
            .map_err(|_| Status::unauthenticated("Basic credentials are not base64"))?;
        let text = String::from_utf8(decoded).map_err(|_| bad())?;
        let (user, password) = text.split_once(':').ok_or_else(bad)?;
        // Every entry is compared (no early exit on the user name).
        let mut found = None;
        for u in self.users.iter() {
            if constant_time_eq(user, &u.name) & constant_time_eq(password, &u.password) {
                found = Some(Principal {
                    user: u.name.clone(),
                    role: u.role,
                });
            }
        }
        found.ok_or_else(bad)
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

/// The users of the server: `WEIR_PASSWORD` (one admin, `user`), or the
/// file named by `password_file` (never the command line): either
/// `user:role:password` lines, or one line holding a lone password for
/// `user` (an admin). Errors name the file and line.
pub fn load_users(password_file: Option<&std::path::Path>, user: &str) -> Result<Vec<User>, String> {
    let admin = |password: &str| User {
        name: user.to_string(),
        password: password.to_string(),
        role: Role::Admin,
    };
    if let Ok(p) = std::env::var("WEIR_PASSWORD")
        && !p.is_empty()
    {
        return Ok(vec![admin(&p)]);
    }
    let Some(path) = password_file else { return Ok(vec![]) };
    let text = std::fs::read_to_string(path).map_err(|e| format!("--password-file {}: {e}", path.display()))?;
    parse_users(&text, user).map_err(|e| format!("--password-file {}: {e}", path.display()))
}

fn parse_users(text: &str, user: &str) -> Result<Vec<User>, String> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .collect();
    match lines.as_slice() {
        [] => return Err("no password in the file".into()),
        [(_, only)] if !only.contains(':') => {
            return Ok(vec![User {
                name: user.to_string(),
                password: only.to_string(),
                role: Role::Admin,
            }]);
        }
        _ => {}
    }
    let mut users: Vec<User> = vec![];
    for (n, line) in lines {
        let mut parts = line.splitn(3, ':');
        let (Some(name), Some(role), Some(password)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("line {n}: expected 'user:role:password'"));
        };
        let role =
            // The field is not echoed: with the fields out of order it
            // could be the password.
            Role::parse(role).ok_or_else(|| format!("line {n}: the role is not one of admin, user, read"))?;
        if name == Principal::local().user {
            return Err(format!(
                "line {n}: the user name '{name}' is reserved (jobs started without a password belong to it)"
            ));
        }
        if name.is_empty() || password.is_empty() {
            return Err(format!("line {n}: the user name and the password must not be empty"));
        }
        if users.iter().any(|u| u.name == name) {
            return Err(format!("line {n}: user '{name}' appears twice"));
        }
        users.push(User {
            name: name.to_string(),
            password: password.to_string(),
            role,
        });
    }
    Ok(users)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_files() {
        let users = parse_users("# team\nalice:admin:a:b\nbob:read:pw\n", "weir").expect("users");
        assert_eq!(users.len(), 2);
        assert_eq!(users[0].password, "a:b");
        assert_eq!(users[1].role, Role::Read);
        let lone = parse_users("s3cret\n", "weir").expect("lone");
        assert_eq!((lone[0].name.as_str(), lone[0].role), ("weir", Role::Admin));
        assert!(
            parse_users("alice:writer:pw", "weir")
                .expect_err("role")
                .contains("line 1")
        );
        assert!(parse_users("", "weir").is_err());
        assert!(
            parse_users("a:read:x\na:admin:y", "weir")
                .expect_err("twice")
                .contains("line 2")
        );
    }
}
