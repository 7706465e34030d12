//! A [`CheckpointStore`] on an object store (S3 and compatible, GCS,
//! Azure, or anything else the `object_store` crate speaks), below a
//! prefix.
//!
//! Objects have no directories, no renames and no fsync: a PUT is atomic
//! and durable when it returns, so the commit point
//! ([`CheckpointStore::publish`]) is one PUT of `_metadata` after every
//! file it names was PUT. A large file goes up in parts (multipart
//! upload, parts in parallel) and becomes visible only when complete. A
//! checkpoint id is taken by a marker object ([`RESERVED`]) that listings
//! of the id's prefix do not show.
//!
//! The trait is blocking; the object store is async. Requests run on a
//! small runtime of the store's own, so a caller on the blocking pool (or
//! any other thread) waits for them without needing, or blocking, the
//! job's runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::io::AsyncWriteExt;

use super::CheckpointError;
use super::store::{CheckpointStore, Created, Listed};
use crate::failpoint::{failpoint, failpoint_io};

/// The marker object that keeps a taken prefix (a checkpoint id) listed.
pub const RESERVED: &str = ".reserved";

/// Bytes read from a local file per write into an upload.
const CHUNK: usize = 1 << 20;

/// Checkpoint files below `prefix` of an object store.
pub struct ObjectCheckpointStore {
    store: Arc<dyn ObjectStore>,
    prefix: Key,
    /// How the prefix is written in messages (`s3://bucket/jobs/q5`).
    base: String,
}

/// The runtime object-store requests run on (one per process, two
/// threads: requests are I/O).
fn runtime() -> Result<&'static tokio::runtime::Runtime, CheckpointError> {
    static RUNTIME: std::sync::OnceLock<Result<tokio::runtime::Runtime, String>> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("weir-object-store")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| CheckpointError::Internal(format!("cannot start the object-store runtime: {e}")))
}

pub use crate::paths::is_object_url;

/// How to reach an S3 endpoint (Flink's `s3.*` options); what is not set
/// comes from the standard `AWS_*` environment variables and credential
/// chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    /// `s3.endpoint`: an S3-compatible server (`http://` allows plain
    /// HTTP).
    pub endpoint: Option<String>,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    pub region: Option<String>,
    /// `s3.path.style.access`: bucket in the path, not the host name.
    pub path_style: Option<bool>,
}

/// The checkpoint (or savepoint) storage rooted at `path`: on the object
/// store its URL names (opened with `s3`), or the local directory.
pub fn storage_at(path: &Path, s3: &S3Settings) -> Result<super::storage::CheckpointStorage, CheckpointError> {
    let text = path.to_string_lossy();
    if !crate::paths::is_object_url(&text) {
        return Ok(super::storage::CheckpointStorage::new(path.to_path_buf()));
    }
    let store = open_url(&text, s3).map_err(CheckpointError::Internal)?;
    Ok(super::storage::CheckpointStorage::on(
        Arc::new(store),
        PathBuf::from(text.trim().trim_end_matches('/')),
    ))
}

/// An object-store location opened: its store (which also takes
/// multipart uploads part by part, for files that must stay invisible
/// until a checkpoint commits them) and the prefix below the bucket.
pub struct Bucket {
    pub store: Arc<dyn ObjectStore>,
    pub multipart: Arc<dyn object_store::multipart::MultipartStore>,
    /// The key prefix the URL names below its bucket ("" for the bucket).
    pub prefix: String,
    /// The URL as given, without a trailing '/', for messages.
    pub url: String,
    /// The lister of uploads in progress, on S3 (the other stores' APIs
    /// have none `object_store` can sign for).
    pub uploads: Option<Arc<super::s3_uploads::S3Uploads>>,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bucket({})", self.url)
    }
}

/// The store of the object-store URL `url` (see [`is_object_url`]):
/// `s3://bucket/prefix` with `s3`, `gs://bucket/prefix` and
/// `az://container/prefix` with the environment's credentials. An error
/// says what is wrong with the URL or the settings.
pub fn open_url(url: &str, s3: &S3Settings) -> Result<ObjectCheckpointStore, String> {
    let b = open_bucket(url, s3)?;
    Ok(ObjectCheckpointStore::new(b.store, &b.prefix, &b.url))
}

/// Opens the object-store URL `url` (see [`open_url`]).
pub fn open_bucket(url: &str, s3: &S3Settings) -> Result<Bucket, String> {
    let url = url.trim().trim_end_matches('/');
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("'{url}' is not a URL"))?;
    let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        return Err(format!("'{url}' names no bucket"));
    }
    let bucket_url = format!("{scheme}://{host}");
    fn both<S: ObjectStore + object_store::multipart::MultipartStore>(
        s: S,
    ) -> (Arc<dyn ObjectStore>, Arc<dyn object_store::multipart::MultipartStore>) {
        let s = Arc::new(s);
        (s.clone(), s)
    }
    let mut uploads = None;
    let (store, multipart) = match scheme.to_ascii_lowercase().as_str() {
        "s3" | "s3a" => {
            let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(bucket_url);
            if let Some(e) = &s3.endpoint {
                b = b
                    .with_endpoint(e)
                    .with_allow_http(e.to_ascii_lowercase().starts_with("http://"));
            }
            if let Some(k) = &s3.access_key {
                b = b.with_access_key_id(k);
            }
            if let Some(k) = &s3.secret_key {
                b = b.with_secret_access_key(k);
            }
            if let Some(r) = &s3.region {
                b = b.with_region(r);
            } else if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none() {
                b = b.with_region("us-east-1");
            }
            if let Some(p) = s3.path_style {
                b = b.with_virtual_hosted_style_request(!p);
            }
            let s3 = Arc::new(b.clone().build().map_err(|e| format!("'{url}': {e}"))?);
            uploads = Some(Arc::new(
                super::s3_uploads::S3Uploads::new(&b, host, s3.clone()).map_err(|e| format!("'{url}': {e}"))?,
            ));
            (
                s3.clone() as Arc<dyn ObjectStore>,
                s3 as Arc<dyn object_store::multipart::MultipartStore>,
            )
        }
        "gs" => both(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(bucket_url)
                .build()
                .map_err(|e| format!("'{url}': {e}"))?,
        ),
        "az" | "azure" | "abfs" | "abfss" => both(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(bucket_url)
                .build()
                .map_err(|e| format!("'{url}': {e}"))?,
        ),
        other => return Err(format!("'{url}': '{other}://' is not an object store Weir can use")),
    };
    Ok(Bucket {
        store,
        multipart,
        prefix: prefix.trim_matches('/').to_string(),
        url: url.to_string(),
        uploads,
    })
}

/// Runs `fut` on the object-store runtime and waits for it, from any
/// thread (a runtime thread too: it is not this runtime's). `what` names
/// the request in the error of a dropped one.
pub fn block_on<T: Send + 'static>(
    what: &str,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().map_err(|e| e.to_string())?.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().map_err(|_| format!("a request to {what} was dropped"))
}

/// [`block_on`] for work that is mostly computation: `fut` is first
/// polled on this thread, inside the object-store runtime's context (what
/// it spawns and the I/O it starts belong to that runtime), and only if it
/// then waits for I/O is it handed to the runtime and waited for. A Delta
/// writer's `write` encodes Parquet and seldom waits (a finished row group
/// starts an upload in the background): run on the runtime, each batch
/// crossed threads twice and the caller's thread sat idle while another
/// encoded, 15 % of a pass-through job's throughput at parallelism 2.
pub fn block_on_here<T: Send + 'static>(
    what: &str,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    let rt = runtime().map_err(|e| e.to_string())?;
    // Unconstrained: polled on a job task's thread, it must not spend (or
    // be stopped by) that task's cooperative budget.
    let mut fut = Box::pin(tokio::task::unconstrained(fut));
    {
        let _context = rt.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // A panic inside is the request's failure, as on the runtime
        // (where `block_on` reports it as dropped), not the caller's.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(&mut cx))) {
            Ok(std::task::Poll::Ready(out)) => return Ok(out),
            Ok(std::task::Poll::Pending) => {}
            Err(_) => return Err(format!("a request to {what} failed (it panicked)")),
        }
    }
    // Pending: what it waits for holds a waker that wakes nothing; polled
    // again on the runtime, the future registers the runtime's (a future
    // must accept being polled with another waker).
    block_on(what, fut)
}

impl std::fmt::Debug for ObjectCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectCheckpointStore({})", self.base)
    }
}

/// An object store's error as the checkpoint error of `path`.
fn failed(path: PathBuf, e: object_store::Error) -> CheckpointError {
    match e {
        object_store::Error::NotFound { .. } => CheckpointError::Missing { path },
        e => CheckpointError::Io {
            path,
            source: std::io::Error::other(e),
        },
    }
}

impl ObjectCheckpointStore {
    /// The store's objects below `prefix`; `base` names them in messages.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, base: &str) -> Self {
        Self {
            store,
            prefix: Key::from(prefix.trim_matches('/')),
            base: base.trim_end_matches('/').to_string(),
        }
    }

    /// The same store below `rel` (a job's directory below the
    /// checkpoint root).
    pub fn below(&self, rel: &str) -> Self {
        Self {
            store: self.store.clone(),
            prefix: self.key(rel),
            base: format!("{}/{}", self.base, rel.trim_matches('/')),
        }
    }

    fn key(&self, rel: &str) -> Key {
        let mut key = self.prefix.clone();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            key = key.join(part);
        }
        key
    }

    /// Runs `fut` on the store's runtime and waits for it, from any
    /// thread (a runtime thread too: it is not this runtime's).
    fn wait<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, CheckpointError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime()?.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| CheckpointError::Internal(format!("a request to {} was dropped", self.base)))
    }

    /// Every object below `rel` (recursively): (key, size).
    fn list_all(&self, rel: &str) -> Result<Vec<(Key, u64)>, CheckpointError> {
        let store = self.store.clone();
        let prefix = self.key(rel);
        let path = self.locate(rel);
        self.wait(async move {
            store
                .list(Some(&prefix))
                .map_ok(|m| (m.location, m.size))
                .try_collect::<Vec<_>>()
                .await
        })?
        .map_err(|e| failed(path, e))
    }

    fn delete_keys(&self, keys: Vec<Key>, rel: &str) -> Result<(), CheckpointError> {
        let store = self.store.clone();
        let path = self.locate(rel);
        self.wait(async move {
            let stream = futures::stream::iter(keys.into_iter().map(Ok)).boxed();
            let results: Vec<_> = store.delete_stream(stream).collect().await;
            for r in results {
                match r {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })?
        .map_err(|e| failed(path, e))
    }
}

impl CheckpointStore for ObjectCheckpointStore {
    fn put_file(&self, rel: &str, src: &Path, fault: Option<&str>) -> Result<(u64, String), CheckpointError> {
        let store = self.store.clone();
        let key = self.key(rel);
        let path = self.locate(rel);
        let src = src.to_path_buf();
        let fault = fault.map(str::to_string);
        self.wait(async move {
            use std::hash::Hasher;
            use tokio::io::AsyncReadExt;
            let local = |source| CheckpointError::Io {
                path: src.clone(),
                source,
            };
            let remote = |e: std::io::Error| CheckpointError::Io {
                path: path.clone(),
                source: e,
            };
            let mut input = tokio::fs::File::open(&src).await.map_err(local)?;
            // Small files go up in one PUT; larger ones in parts, in
            // parallel, visible only once complete.
            let mut out = object_store::buffered::BufWriter::new(store, key);
            let mut h = twox_hash::XxHash64::with_seed(0);
            let mut buf = vec![0u8; CHUNK];
            let mut total = 0u64;
            loop {
                let n = input.read(&mut buf).await.map_err(local)?;
                if n == 0 {
                    break;
                }
                h.write(&buf[..n]);
                if let Err(e) = out.write_all(&buf[..n]).await {
                    let _ = out.abort().await;
                    return Err(remote(e));
                }
                if total == 0
                    && let Some(name) = &fault
                    && let Err(e) = failpoint_io(name)
                {
                    // An upload cut short: nothing becomes visible.
                    let _ = out.abort().await;
                    return Err(remote(e));
                }
                total += n as u64;
            }
            out.shutdown().await.map_err(remote)?;
            Ok((total, format!("{:016x}", h.finish())))
        })?
    }

    fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let path = self.locate(rel);
        // As a local write failing half-way: nothing of a PUT is visible.
        failpoint_io("checkpoint.upload").map_err(|source| CheckpointError::Io {
            path: path.clone(),
            source,
        })?;
        let store = self.store.clone();
        let key = self.key(rel);
        let payload = PutPayload::from(bytes.to_vec());
        self.wait(async move { store.put(&key, payload).await })?
            .map(|_| ())
            .map_err(|e| failed(path, e))
    }

    fn publish(&self, rel: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let path = self.locate(rel);
        failpoint("checkpoint.before_metadata_write");
        failpoint_io("checkpoint.metadata_write").map_err(|source| CheckpointError::Io {
            path: path.clone(),
            source,
        })?;
        // Every object named was PUT (durable on return) before this one.
        failpoint("checkpoint.before_metadata_rename");
        let store = self.store.clone();
        let key = self.key(rel);
        let payload = PutPayload::from(bytes.to_vec());
        self.wait(async move { store.put(&key, payload).await })?
            .map_err(|e| failed(path, e))?;
        failpoint("checkpoint.after_metadata_rename");
        Ok(())
    }

    fn create(&self, rel: &str, bytes: &[u8]) -> Result<Created, CheckpointError> {
        let store = self.store.clone();
        let key = self.key(rel);
        let path = self.locate(rel);
        let payload = PutPayload::from(bytes.to_vec());
        // S3 `If-None-Match: *`, GCS `x-goog-if-generation-match: 0`,
        // Azure `If-None-Match: *`. A create is not retried on a timeout
        // by the client, but is on a lost connection, so `AlreadyExists`
        // may be this writer's own earlier try: the bytes read back tell.
        let opts = object_store::PutOptions::from(object_store::PutMode::Create);
        match self.wait(async move { store.put_opts(&key, payload, opts).await })? {
            Ok(_) => Ok(Created::Created),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::Exists(self.get(rel)?)),
            Err(e) => Err(failed(path, e)),
        }
    }

    fn get(&self, rel: &str) -> Result<Vec<u8>, CheckpointError> {
        let store = self.store.clone();
        let key = self.key(rel);
        let path = self.locate(rel);
        self.wait(async move {
            let got = store.get(&key).await?;
            got.bytes().await
        })?
        .map(|b| b.to_vec())
        .map_err(|e| failed(path, e))
    }

    fn get_to_file(&self, rel: &str, dst: &Path) -> Result<(u64, String), CheckpointError> {
        let store = self.store.clone();
        let key = self.key(rel);
        let path = self.locate(rel);
        let dst = dst.to_path_buf();
        self.wait(async move {
            use std::hash::Hasher;
            let local = |source| CheckpointError::LocalState {
                path: dst.clone(),
                source,
            };
            let got = store.get(&key).await.map_err(|e| failed(path.clone(), e))?;
            let mut out = tokio::fs::File::create(&dst).await.map_err(local)?;
            let mut stream = got.into_stream();
            let mut h = twox_hash::XxHash64::with_seed(0);
            let mut total = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| failed(path.clone(), e))?;
                h.write(&chunk);
                out.write_all(&chunk).await.map_err(local)?;
                total += chunk.len() as u64;
            }
            out.sync_all().await.map_err(local)?;
            Ok((total, format!("{:016x}", h.finish())))
        })?
    }

    fn size(&self, rel: &str) -> Result<Option<u64>, CheckpointError> {
        let store = self.store.clone();
        let key = self.key(rel);
        let path = self.locate(rel);
        match self.wait(async move { store.head(&key).await })? {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failed(path, e)),
        }
    }

    fn list(&self, rel: &str) -> Result<Vec<Listed>, CheckpointError> {
        let store = self.store.clone();
        let prefix = self.key(rel);
        let path = self.locate(rel);
        let listed = self
            .wait(async move { store.list_with_delimiter(Some(&prefix)).await })?
            .map_err(|e| failed(path, e))?;
        let mut out: Vec<Listed> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename())
            .map(|name| Listed {
                name: name.to_string(),
                is_prefix: true,
                size: 0,
            })
            .chain(listed.objects.iter().filter_map(|m| {
                let name = m.location.filename()?;
                (name != RESERVED).then(|| Listed {
                    name: name.to_string(),
                    is_prefix: false,
                    size: m.size,
                })
            }))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn delete(&self, rel: &str) -> Result<(), CheckpointError> {
        let store = self.store.clone();
        let key = self.key(rel);
        let path = self.locate(rel);
        match self.wait(async move { store.delete(&key).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(failed(path, e)),
        }
    }

    fn delete_prefix(&self, rel: &str) -> Result<u64, CheckpointError> {
        let objects = self.list_all(rel)?;
        let freed = objects.iter().map(|(_, size)| size).sum();
        self.delete_keys(objects.into_iter().map(|(k, _)| k).collect(), rel)?;
        Ok(freed)
    }

    fn reserve(&self, rel: &str) -> Result<(), CheckpointError> {
        self.put(&format!("{rel}/{RESERVED}"), &[])
    }

    fn rename_prefix(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        let objects = self.list_all(from)?;
        let (src, dst) = (self.key(from), self.key(to));
        let mut moves = vec![];
        for (key, _) in &objects {
            let mut target = dst.clone();
            for part in key.prefix_match(&src).into_iter().flatten() {
                target = target.join(part);
            }
            moves.push((key.clone(), target));
        }
        let store = self.store.clone();
        let path = self.locate(to);
        // Copies first, then deletes: a failure half-way leaves both
        // (restorable either way), never neither.
        self.wait(async move {
            for (from, to) in &moves {
                store.copy(from, to).await?;
            }
            Ok::<_, object_store::Error>(())
        })?
        .map_err(|e| failed(path, e))?;
        self.delete_keys(objects.into_iter().map(|(k, _)| k).collect(), from)
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        let store = self.store.clone();
        let (src, dst) = (self.key(from), self.key(to));
        let path = self.locate(to);
        // Copied, then deleted: a failure between leaves both.
        self.wait(async move { store.copy(&src, &dst).await })?
            .map_err(|e| failed(path, e))?;
        self.delete(from)
    }

    fn remove_root_if_empty(&self) {
        // A prefix with nothing below it does not exist.
    }

    fn locate(&self, rel: &str) -> PathBuf {
        PathBuf::from(format!("{}/{}", self.base, rel.trim_start_matches('/')))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CheckpointStorage;
    use crate::checkpoint::metadata::{CheckpointMetadata, OperatorState};

    /// Computation finishes on the caller's thread; what is pending (a
    /// yield, a spawned task's handle) finishes on the runtime; a panic is the
    /// request's error. From a thread of another runtime too.
    #[test]
    fn block_on_here_answers_ready_pending_and_panicking_futures() {
        let here = std::thread::current().id();
        let ran_on = block_on_here("a test", async { std::thread::current().id() }).expect("ready");
        assert_eq!(ran_on, here);
        // Pending once (no timer: the test waits on no time), then ready.
        let yielded = block_on_here("a test", async {
            tokio::task::yield_now().await;
            7
        });
        assert_eq!(yielded, Ok(7));
        let joined = block_on_here("a test", async {
            tokio::spawn(async {
                tokio::task::yield_now().await;
                5
            })
            .await
            .expect("join")
        });
        assert_eq!(joined, Ok(5));
        let panicked = block_on_here("a test", async {
            if std::hint::black_box(true) {
                panic!("boom");
            }
            1
        });
        assert!(panicked.is_err_and(|e| e.contains("panicked")));
        let other = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let inside = other.block_on(async {
            block_on_here("a test", async {
                tokio::task::yield_now().await;
                3
            })
        });
        assert_eq!(inside, Ok(3));
    }

    fn in_memory() -> ObjectCheckpointStore {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        ObjectCheckpointStore::new(store, "jobs/q5", "memory://jobs/q5")
    }

    #[test]
    fn objects_round_trip_list_and_delete_as_files_do() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = in_memory();
        assert!(s.list("").expect("list").is_empty());
        // Above one part: uploaded in parts, read back whole.
        let big: Vec<u8> = (0..(12 << 20)).map(|i| (i % 251) as u8).collect();
        let src = dir.path().join("big.sst");
        std::fs::write(&src, &big).expect("write");
        let (size, sum) = s.put_file("shared/big.sst", &src, None).expect("upload");
        assert_eq!(
            (size, sum.as_str()),
            (big.len() as u64, super::super::metadata::checksum(&big).as_str())
        );
        let back = dir.path().join("back.sst");
        assert_eq!(s.get_to_file("shared/big.sst", &back).expect("download"), (size, sum));
        assert_eq!(std::fs::read(&back).expect("read"), big);
        s.reserve("chk-2").expect("reserve");
        s.put("chk-1/MANIFEST", b"m").expect("put");
        s.publish("chk-1/_metadata", b"meta").expect("publish");
        let names: Vec<(String, bool)> = s
            .list("")
            .expect("list")
            .into_iter()
            .map(|l| (l.name, l.is_prefix))
            .collect();
        assert_eq!(
            names,
            [("chk-1".into(), true), ("chk-2".into(), true), ("shared".into(), true)]
        );
        assert!(s.list("chk-2").expect("list").is_empty(), "the marker is not listed");
        assert_eq!(s.size("chk-1/_metadata").expect("size"), Some(4));
        assert_eq!(s.size("chk-1/nothing").expect("size"), None);
        assert!(matches!(s.get("chk-1/nothing"), Err(CheckpointError::Missing { .. })));
        s.rename_prefix("chk-1", "retained-7/chk-1").expect("rename");
        assert_eq!(s.get("retained-7/chk-1/_metadata").expect("get"), b"meta");
        assert!(s.list("chk-1").expect("list").is_empty());
        assert_eq!(s.delete_prefix("retained-7").expect("delete"), 5);
        s.delete("chk-1/_metadata").expect("a missing object is fine");
        assert_eq!(s.create("log/1", b"mine").expect("create"), Created::Created);
        assert_eq!(
            s.create("log/1", b"theirs").expect("create"),
            Created::Exists(b"mine".to_vec())
        );
        assert_eq!(
            s.locate("chk-1/_metadata"),
            PathBuf::from("memory://jobs/q5/chk-1/_metadata")
        );
    }

    /// The checkpoint layout on an object store: ids taken and never
    /// reused, completion by `_metadata`, verified loads, a discarded
    /// attempt, and garbage collection by reference.
    #[test]
    fn checkpoint_storage_works_on_an_object_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = CheckpointStorage::on(Arc::new(in_memory()), PathBuf::from("memory://jobs/q5"));
        assert_eq!(storage.next_id().expect("next"), 1);
        let fence = super::super::Fence::claim(&storage).expect("claim");
        assert!(fence.claim_id(1).expect("claim id"));
        let src = dir.path().join("a.sst");
        std::fs::write(&src, b"sst-1").expect("write");
        let shared = storage.upload(1, &src, "op-0-c1-000001.sst", true).expect("upload");
        let private = storage.write_private(1, "heap.bin", b"heap").expect("private");
        let mut operators = std::collections::BTreeMap::new();
        operators.insert(
            "op/0".to_string(),
            OperatorState::Rocksdb {
                files: [("000001.sst".to_string(), shared.clone())].into(),
                key_groups: 0..128,
                identity: "i".into(),
            },
        );
        operators.insert("limit/0".to_string(), OperatorState::Heap { file: private.clone() });
        let meta = CheckpointMetadata {
            format: super::super::metadata::FORMAT_VERSION,
            checkpoint_id: 1,
            job: "q5".into(),
            plan_fingerprint: "p".into(),
            trigger_time_ms: 0,
            is_final: false,
            max_parallelism: 128,
            key_format: crate::state::codec::FORMAT_VERSION,
            savepoint: None,
            operator_info: Default::default(),
            sources: Default::default(),
            operators,
        };
        storage.commit_metadata(&meta).expect("commit");
        assert!(storage.complete_ids().expect("ids").is_empty(), "not published yet");
        fence.publish(1).expect("publish");
        assert_eq!(storage.complete_ids().expect("ids"), [1]);
        let loaded = storage.load(1).expect("load");
        assert_eq!(loaded.checkpoint_id, 1);
        assert_eq!(storage.read_file(&private).expect("read"), b"heap");
        // A failed attempt at 2: its files go, its id stays taken.
        assert!(fence.claim_id(2).expect("claim id"));
        storage.upload(2, &src, "op-0-c2-000002.sst", true).expect("upload");
        storage.write_private(2, "heap.bin", b"x").expect("private");
        storage
            .discard_attempt(2, &["op-0-c2-000002.sst".into()])
            .expect("discard");
        assert_eq!(storage.next_id().expect("next"), 3);
        assert_eq!(storage.complete_ids().expect("ids"), [1]);
        // GC keeps what checkpoint 1 references and drops what was
        // uploaded for it or earlier and is not referenced; what a newer
        // checkpoint uploads (perhaps another run's) stays.
        let stray = storage.upload(1, &src, "op-0-c1-000009.sst", true).expect("upload");
        let newer = storage.upload(3, &src, "op-0-c3-000003.sst", true).expect("upload");
        storage.collect_garbage(&[&loaded]).expect("gc");
        assert_eq!(storage.complete_ids().expect("ids"), [1]);
        assert_eq!(storage.load(1).expect("load"), loaded, "its files are all there");
        assert!(matches!(
            storage.read_file(&stray),
            Err(CheckpointError::Missing { .. })
        ));
        assert_eq!(storage.read_file(&newer).expect("newer"), b"sst-1");
    }
}
