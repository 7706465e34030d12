//! The files of a table on an object store (a `path` of
//! `s3://bucket/prefix`, `gs://`, `az://`): listed and downloaded for the
//! source, and written exactly once for the sink the way Flink's S3
//! recoverable writer does it: no rename exists on an object store, so a
//! part is made visible by completing a multipart upload.
//!
//! Reading: the visible objects below the path (no segment starting with
//! '.' or '_', as on local files; `k=v` directories to the depth of the
//! partition keys), or the one object the path names. A split downloads
//! its object into an unnamed local temporary file when it opens it and
//! reads that as a local file; a byte range of a line-delimited object
//! downloads only its bytes, at their own offsets.
//!
//! A writer spools its current part to a local file (as on a local
//! path). At the checkpoint barrier the part goes up as a multipart
//! upload that is *not completed*: durable, yet no reader sees an
//! object. Before the upload starts its parts, a hidden marker
//! `.<name>.upload` beside the target records the upload's id, so that a
//! recovery finds and aborts the uploads no completed checkpoint holds.
//! The committable names the upload and its parts; when the checkpoint is
//! complete the committer completes the upload (the object appears whole,
//! at once) and deletes the marker. Completing again after a recovery
//! finds the upload gone and the object there: committed before.
//!
//! A writer killed after it created an upload and before its marker was
//! written leaves an upload no marker names. On S3 the recovery also
//! lists the uploads in progress below the table (ListMultipartUploads,
//! [`crate::checkpoint::s3_uploads`]) and aborts the job's: after a
//! recovery no upload of the job is left. GCS and Azure have no such
//! listing `object_store` can sign for: there that window is left to the
//! bucket's lifecycle rule (`AbortIncompleteMultipartUpload` and its
//! kin), as Flink's documentation asks for the same reason; it holds no
//! visible data.

use std::path::Path;

use futures::{StreamExt, TryStreamExt};
use object_store::multipart::PartId;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};

use crate::checkpoint::objects::{Bucket, S3Settings, block_on, open_bucket};
use crate::checkpoint::s3_uploads::S3Uploads;
use crate::error::{ConnectorError, Result};

/// Bytes per uploaded part: S3 wants at least 5 MiB for every part but
/// the last, and some stores (R2) equal sizes.
const PART_SIZE: usize = 8 << 20;
/// Parts in flight at once per upload.
const PARALLEL_PARTS: usize = 4;
/// The marker of an uncompleted upload ends so.
pub(crate) const UPLOAD_SUFFIX: &str = ".upload";

/// The files of a table on an object store.
#[derive(Debug)]
pub(crate) struct ObjectFiles {
    bucket: Bucket,
}

impl ObjectFiles {
    /// The table at `url` (the `path` option), reached with `s3`.
    pub fn open(url: &str, s3: &S3Settings) -> Result<Self> {
        let bucket = open_bucket(url, s3).map_err(|message| weir_catalog::CatalogError::InvalidOption {
            key: "path".into(),
            message,
        })?;
        Ok(Self { bucket })
    }

    /// The files of the table with `options`, if its `path` is on an
    /// object store.
    pub fn of_table(options: &weir_catalog::Options, s3: &S3Settings) -> Result<Option<std::sync::Arc<Self>>> {
        let path = options.require(crate::paths::TABLE_PATH)?;
        if !crate::paths::is_object_url(path) {
            return Ok(None);
        }
        Ok(Some(std::sync::Arc::new(Self::open(path, s3)?)))
    }

    /// The table's URL, for messages.
    pub fn url(&self) -> &str {
        &self.bucket.url
    }

    fn key(&self, rel: &str) -> Key {
        let mut key = Key::from(self.bucket.prefix.as_str());
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            key = key.join(part);
        }
        key
    }

    /// An object-store failure of `rel`, with the object's URL.
    fn failed(&self, rel: &str, e: impl std::fmt::Display) -> ConnectorError {
        ConnectorError::Io {
            path: format!("{}/{}", self.bucket.url, rel.trim_start_matches('/')),
            source: std::io::Error::other(e.to_string()),
        }
    }

    fn wait<T: Send + 'static>(&self, rel: &str, fut: impl Future<Output = T> + Send + 'static) -> Result<T> {
        block_on(&self.bucket.url, fut).map_err(|e| self.failed(rel, e).into())
    }

    /// Every object below the path, recursively.
    fn list_all(&self) -> Result<Vec<Key>> {
        let (store, prefix) = (self.bucket.store.clone(), self.key(""));
        self.wait("", async move {
            store
                .list(Some(&prefix))
                .map_ok(|m| m.location)
                .try_collect::<Vec<_>>()
                .await
        })?
        .map_err(|e| self.failed("", e).into())
    }

    /// The visible objects to read, relative to the path, sorted: those
    /// directly below it, or (`partition_depth` d) below d `k=v`
    /// directories; else the one object the path names. Nothing there is
    /// an error unless `may_be_empty`.
    pub fn list_visible(&self, partition_depth: Option<usize>, may_be_empty: bool) -> Result<Vec<String>> {
        let listed = self.list_all()?;
        let base = self.key("");
        let mut out = vec![];
        for key in listed {
            let Some(parts) = key.prefix_match(&base) else { continue };
            let parts: Vec<String> = parts.map(|p| p.as_ref().to_string()).collect();
            let Some((name, dirs)) = parts.split_last() else {
                continue;
            };
            if parts.iter().any(|p| p.starts_with('.') || p.starts_with('_')) {
                continue;
            }
            let wanted = match partition_depth {
                None => dirs.is_empty(),
                Some(d) => dirs.len() == d && dirs.iter().all(|p| p.contains('=')),
            };
            if wanted {
                out.push(if dirs.is_empty() {
                    name.clone()
                } else {
                    format!("{}/{name}", dirs.join("/"))
                });
            }
        }
        if out.is_empty() {
            // The path names one object, or nothing: an object store has
            // no empty directories, and a misspelt path must not read as
            // an empty table.
            if self.bucket.prefix.is_empty() || !self.exists("")? {
                if may_be_empty {
                    return Ok(vec![]);
                }
                return Err(ConnectorError::Io {
                    path: self.bucket.url.clone(),
                    source: std::io::Error::new(std::io::ErrorKind::NotFound, "no object at or below this path"),
                }
                .into());
            }
            out.push(String::new());
        }
        out.sort();
        Ok(out)
    }

    /// The object `rel` ("" for the path's own), downloaded into an
    /// unnamed temporary file (gone when closed), positioned at its start.
    pub fn download(&self, rel: &str) -> Result<std::fs::File> {
        self.fetch(rel, None)
    }

    /// The size of the object `rel` in bytes.
    pub fn size(&self, rel: &str) -> Result<u64> {
        let (store, key) = (self.bucket.store.clone(), self.key(rel));
        let meta = self.wait(rel, async move { store.head(&key).await })?;
        Ok(meta.map_err(|e| self.failed(rel, e))?.size)
    }

    /// Where the first `need` of `n` byte ranges of the line-delimited
    /// object `rel` start: as `records::range_starts` finds them in a
    /// local file without quotes (the first line break at or after a
    /// range's share of the bytes, less one), with a small ranged read
    /// at each share instead of reading the bytes before it.
    pub fn line_range_starts(&self, rel: &str, n: usize, need: usize) -> Result<Vec<u64>> {
        const PROBE: u64 = 64 << 10;
        let n = n.max(1);
        let need = need.clamp(1, n);
        let size = self.size(rel)?;
        let mut starts = vec![0u64];
        for i in 1..need {
            let target = size * i as u64 / n as u64;
            // Several targets may fall in one record: they share it.
            if let Some(&last) = starts.last()
                && last >= target
                && last > 0
            {
                starts.push(last);
                continue;
            }
            let mut from = target.saturating_sub(1);
            let start = loop {
                if from >= size {
                    break size;
                }
                let to = (from + PROBE).min(size);
                let (store, key) = (self.bucket.store.clone(), self.key(rel));
                let bytes = self
                    .wait(rel, async move { store.get_range(&key, from..to).await })?
                    .map_err(|e| self.failed(rel, e))?;
                if let Some(k) = memchr::memchr(b'\n', &bytes) {
                    break from + k as u64 + 1;
                }
                from = to;
            };
            starts.push(start);
        }
        Ok(starts)
    }

    /// Bytes `range` of the object `rel`, written at their own offsets
    /// into an unnamed temporary file (sparse before them: a byte range
    /// of a big object costs its own bytes, and offsets, positions and
    /// restores are the object's, as for a local file).
    pub fn download_range(&self, rel: &str, range: std::ops::Range<u64>) -> Result<std::fs::File> {
        self.fetch(rel, Some(range))
    }

    /// The object `rel` (or bytes `range` of it, at their own offsets) in
    /// an unnamed temporary file, positioned at its start.
    fn fetch(&self, rel: &str, range: Option<std::ops::Range<u64>>) -> Result<std::fs::File> {
        let temp = |source| ConnectorError::Io {
            path: std::env::temp_dir().display().to_string(),
            source,
        };
        let local = tempfile::tempfile().map_err(temp)?;
        let copy = local.try_clone().map_err(temp)?;
        let (store, key) = (self.bucket.store.clone(), self.key(rel));
        let done = self.wait(rel, async move {
            use tokio::io::{AsyncSeekExt, AsyncWriteExt};
            let mut out = tokio::fs::File::from_std(copy);
            let start = range.as_ref().map_or(0, |r| r.start);
            out.seek(std::io::SeekFrom::Start(start))
                .await
                .map_err(|e| format!("writing the local copy: {e}"))?;
            if range.as_ref().is_some_and(|r| r.is_empty()) {
                return Ok(());
            }
            let options = object_store::GetOptions {
                range: range.map(object_store::GetRange::Bounded),
                ..Default::default()
            };
            let mut stream = store
                .get_opts(&key, options)
                .await
                .map_err(|e| e.to_string())?
                .into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                out.write_all(&chunk)
                    .await
                    .map_err(|e| format!("writing the local copy: {e}"))?;
            }
            out.flush().await.map_err(|e| format!("writing the local copy: {e}"))?;
            Ok::<_, String>(())
        })?;
        done.map_err(|e| self.failed(rel, e))?;
        let mut local = local;
        std::io::Seek::rewind(&mut local).map_err(temp)?;
        Ok(local)
    }

    /// Line breaks in the first `offset` bytes of the object `rel` (the
    /// line a byte range starts after; asked only to report a record).
    pub fn lines_before(&self, rel: &str, offset: u64) -> Result<u64> {
        if offset == 0 {
            return Ok(0);
        }
        let (store, key) = (self.bucket.store.clone(), self.key(rel));
        let counted = self.wait(rel, async move {
            let options = object_store::GetOptions {
                range: Some(object_store::GetRange::Bounded(0..offset)),
                ..Default::default()
            };
            let mut stream = store.get_opts(&key, options).await?.into_stream();
            let mut lines = 0u64;
            while let Some(chunk) = stream.next().await {
                lines += memchr::memchr_iter(b'\n', &chunk?).count() as u64;
            }
            Ok::<_, object_store::Error>(lines)
        })?;
        Ok(counted.map_err(|e| self.failed(rel, e))?)
    }

    /// Phase one for the local part `local`, to become `rel` (relative to
    /// the table's path): an uncompleted multipart upload, with its marker;
    /// returns the committable.
    pub fn stage(&self, local: &Path, rel: &str) -> Result<serde_json::Value> {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let marker = if dir.is_empty() {
            format!(".{name}{UPLOAD_SUFFIX}")
        } else {
            format!("{dir}/.{name}{UPLOAD_SUFFIX}")
        };
        let key = self.key(rel);
        let multipart = self.bucket.multipart.clone();
        let id = self
            .wait(rel, async move { multipart.create_multipart(&key).await })?
            .map_err(|e| self.failed(rel, e))?;
        // Killed here, the upload exists and no marker names it.
        crate::failpoint::failpoint("sink.upload_created");
        let record = serde_json::json!({ "upload": id, "key": rel });
        self.put_bytes(&marker, record.to_string().into_bytes())?;
        let parts = self.upload_parts(local, rel, &id)?;
        Ok(serde_json::json!({
            "upload": id,
            "parts": parts.into_iter().map(|p| p.content_id).collect::<Vec<_>>(),
            "key": rel,
            "marker": marker,
        }))
    }

    /// The parts of `local`, uploaded into upload `id` of `rel`.
    fn upload_parts(&self, local: &Path, rel: &str, id: &str) -> Result<Vec<PartId>> {
        let local_err = |source| ConnectorError::Io {
            path: local.display().to_string(),
            source,
        };
        let size = std::fs::metadata(local).map_err(local_err)?.len() as usize;
        // An empty part still needs one (empty) part to complete.
        let count = size.div_ceil(PART_SIZE).max(1);
        let (key, multipart, id, local) = (
            self.key(rel),
            self.bucket.multipart.clone(),
            id.to_string(),
            local.to_path_buf(),
        );
        let result = self.wait(rel, async move {
            futures::stream::iter(0..count)
                .map(|i| {
                    let (key, multipart, id, local) = (key.clone(), multipart.clone(), id.clone(), local.clone());
                    async move {
                        let from = local.clone();
                        let chunk = tokio::task::spawn_blocking(move || read_chunk(&from, i * PART_SIZE, PART_SIZE))
                            .await
                            .map_err(|e| e.to_string())?
                            .map_err(|e| format!("{}: {e}", local.display()))?;
                        multipart
                            .put_part(&key, &id, i, PutPayload::from(chunk))
                            .await
                            .map_err(|e| e.to_string())
                    }
                })
                .buffered(PARALLEL_PARTS)
                .try_collect::<Vec<_>>()
                .await
        })?;
        result.map_err(|e| self.failed(rel, e).into())
    }

    /// Without checkpointing: the local part `local` becomes `rel` at once.
    pub fn put(&self, local: &Path, rel: &str) -> Result<()> {
        let c = self.stage(local, rel)?;
        self.complete(&c).map(|_| ())
    }

    /// Puts `bytes` as the object `rel` (visible at once).
    pub fn put_bytes(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        let (store, key) = (self.bucket.store.clone(), self.key(rel));
        self.wait(rel, async move { store.put(&key, PutPayload::from(bytes)).await })?
            .map_err(|e| self.failed(rel, e))?;
        Ok(())
    }

    /// Phase two: completes the upload of committable `c`, then deletes
    /// its marker. Returns whether this call made the object visible
    /// (false: committed before).
    pub fn complete(&self, c: &serde_json::Value) -> Result<bool> {
        let (Some(id), Some(rel), Some(marker), Some(parts)) = (
            c["upload"].as_str(),
            c["key"].as_str(),
            c["marker"].as_str(),
            c["parts"].as_array(),
        ) else {
            return Err(crate::error::ExecError::internal(format!(
                "not an object-store file committable: {c}"
            )));
        };
        let parts: Vec<PartId> = parts
            .iter()
            .filter_map(|p| p.as_str())
            .map(|p| PartId {
                content_id: p.to_string(),
            })
            .collect();
        let (multipart, key, id_owned) = (self.bucket.multipart.clone(), self.key(rel), id.to_string());
        let done = self.wait(rel, async move {
            multipart.complete_multipart(&key, &id_owned, parts).await
        })?;
        let fresh = match done {
            Ok(_) => true,
            Err(e) => {
                // Completed before (a re-commit after recovery): the upload
                // is gone and the object is there.
                if self.exists(rel)? {
                    false
                } else if self.upload_gone(rel, id, &e)? {
                    // As on local files (and Flink's FileSink): committed
                    // before and then moved or deleted downstream.
                    tracing::warn!(
                        "{}/{rel}: neither the upload nor the object exists; assuming it was committed and moved",
                        self.bucket.url
                    );
                    false
                } else {
                    return Err(self.failed(rel, e).into());
                }
            }
        };
        self.delete(marker)?;
        Ok(fresh)
    }

    /// Whether the object `rel` exists.
    pub fn exists(&self, rel: &str) -> Result<bool> {
        let (store, key) = (self.bucket.store.clone(), self.key(rel));
        match self.wait(rel, async move { store.head(&key).await })? {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.failed(rel, e).into()),
        }
    }

    fn delete(&self, rel: &str) -> Result<()> {
        let (store, key) = (self.bucket.store.clone(), self.key(rel));
        match self.wait(rel, async move { store.delete(&key).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.failed(rel, e).into()),
        }
    }

    /// Aborts the uploads whose markers' names `owns` accepts, anywhere
    /// below the table (partitions too), and deletes the markers.
    pub fn abort_unfinished(&self, owns: impl Fn(&str) -> bool) -> Result<()> {
        let listed = self.list_all()?;
        let base = self.key("");
        for key in listed {
            let Some(name) = key.filename() else { continue };
            if !name.ends_with(UPLOAD_SUFFIX) || !owns(name) {
                continue;
            }
            let rel = key
                .prefix_match(&base)
                .map(|parts| parts.map(|p| p.as_ref().to_string()).collect::<Vec<_>>().join("/"))
                .unwrap_or_else(|| key.to_string());
            let (store, k) = (self.bucket.store.clone(), key.clone());
            let bytes = match self.wait(&rel, async move { store.get(&k).await?.bytes().await })? {
                Ok(b) => b,
                // Deleted meanwhile (its upload completed).
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(self.failed(&rel, e).into()),
            };
            let record: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| ConnectorError::Data {
                location: format!("{}/{rel}", self.bucket.url),
                message: format!("not an upload marker: {e}"),
            })?;
            if let (Some(id), Some(target)) = (record["upload"].as_str(), record["key"].as_str()) {
                self.abort(target, id)?;
            }
            self.delete(&rel)?;
        }
        // The uploads no marker names (created, then killed before the
        // marker), where the store can list them.
        let Some(lister) = self.bucket.uploads.clone() else {
            return Ok(());
        };
        for upload in self.list_uploads(&lister)? {
            let key = Key::from(upload.key.as_str());
            let Some(parts) = key.prefix_match(&base) else {
                continue;
            };
            let rel = parts.map(|p| p.as_ref().to_string()).collect::<Vec<_>>().join("/");
            let name = rel.rsplit('/').next().unwrap_or_default();
            if owns(&format!(".{name}{UPLOAD_SUFFIX}")) {
                self.abort(&rel, &upload.id)?;
            }
        }
        Ok(())
    }

    /// The uploads in progress below the table's path.
    fn list_uploads(&self, lister: &std::sync::Arc<S3Uploads>) -> Result<Vec<crate::checkpoint::s3_uploads::Upload>> {
        // Below the path as a directory: `out` is not a prefix of `out2`.
        let prefix = match self.key("").as_ref() {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let lister = lister.clone();
        self.wait("", async move { lister.list(&prefix).await })?
            .map_err(|e| self.failed("", e).into())
    }

    /// Aborts upload `id` of the object `rel`; an upload aborted or
    /// completed before is fine.
    fn abort(&self, rel: &str, id: &str) -> Result<()> {
        let (multipart, key, id_owned) = (self.bucket.multipart.clone(), self.key(rel), id.to_string());
        match self.wait(rel, async move { multipart.abort_multipart(&key, &id_owned).await })? {
            Ok(()) => Ok(()),
            // Completed before (a commit cut short before it deleted the
            // marker): the object is there; or aborted before (a recovery
            // cut short).
            Err(e) => {
                if self.exists(rel)? || self.upload_gone(rel, id, &e)? {
                    Ok(())
                } else {
                    Err(self.failed(rel, e).into())
                }
            }
        }
    }

    /// Whether upload `id` of `rel`, which failed with `e`, no longer
    /// exists (completed or aborted). On S3 the listing of uploads says
    /// so; elsewhere the error must: `NoSuchUpload` (S3's code, kept in
    /// the text by `object_store`) or a not-found.
    fn upload_gone(&self, rel: &str, id: &str, e: &object_store::Error) -> Result<bool> {
        if let Some(lister) = self.bucket.uploads.clone() {
            let key = self.key(rel).to_string();
            let prefix = key.clone();
            let listed = self
                .wait(rel, async move { lister.list(&prefix).await })?
                .map_err(|e| self.failed(rel, e))?;
            return Ok(!listed.iter().any(|u| u.key == key && u.id == id));
        }
        Ok(matches!(e, object_store::Error::NotFound { .. }) || e.to_string().contains("NoSuchUpload"))
    }
}

/// Up to `len` bytes of `path` from `offset`.
fn read_chunk(path: &Path, offset: usize, len: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(offset as u64))?;
    let mut buf = Vec::with_capacity(len);
    f.take(len as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStore;
    use object_store::memory::InMemory;
    use std::sync::Arc;

    fn parts() -> (ObjectFiles, Arc<InMemory>) {
        let mem = Arc::new(InMemory::new());
        let bucket = Bucket {
            store: mem.clone(),
            multipart: mem.clone(),
            prefix: "out".into(),
            url: "memory://out".into(),
            uploads: None,
        };
        (ObjectFiles { bucket }, mem)
    }

    fn names(mem: &InMemory) -> Vec<String> {
        block_on("test", {
            let mem = mem.clone();
            async move {
                mem.list(None)
                    .map_ok(|m| m.location.to_string())
                    .try_collect::<Vec<_>>()
                    .await
            }
        })
        .expect("list")
        .expect("list")
    }

    #[test]
    fn a_staged_part_is_invisible_until_completed_and_completing_twice_is_harmless() {
        let (parts, mem) = parts();
        let dir = tempfile::tempdir().expect("tempdir");
        let local = dir.path().join("p");
        // One part (InMemory takes parts only in order; several parts in
        // parallel are tested on a real S3 server, tests/object_store.rs).
        let body: Vec<u8> = (0..100_003).map(|i| (i % 251) as u8).collect();
        std::fs::write(&local, &body).expect("write");
        let c = parts.stage(&local, "dt=1/part-j-a-0-0.json").expect("stage");
        assert_eq!(c["parts"].as_array().map(Vec::len), Some(1));
        // Only the marker is there: no reader sees the part.
        assert_eq!(names(&mem), ["out/dt=1/.part-j-a-0-0.json.upload"]);
        assert!(parts.complete(&c).expect("complete"));
        assert_eq!(names(&mem), ["out/dt=1/part-j-a-0-0.json"]);
        let got = block_on("test", {
            let mem = mem.clone();
            async move { mem.get(&Key::from("out/dt=1/part-j-a-0-0.json")).await?.bytes().await }
        })
        .expect("get")
        .expect("get");
        assert_eq!(got.as_ref(), body.as_slice());
        // A re-commit after recovery: the upload is gone, the object there.
        assert!(!parts.complete(&c).expect("re-commit"));
    }

    /// The ranges of an object start where a local file's would, and the
    /// bytes of a range land at their own offsets.
    #[test]
    fn byte_ranges_of_an_object_match_a_local_files() {
        let (parts, mem) = parts();
        let dir = tempfile::tempdir().expect("tempdir");
        // Lines of uneven lengths, one longer than several shares.
        let mut body = vec![];
        for i in 0..3000u32 {
            let len = if i == 1500 { 20_000 } else { (i * 7919 % 97) as usize };
            body.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, len));
            body.push(b'\n');
        }
        body.extend(b"no line break at the end");
        let local = dir.path().join("big.json");
        std::fs::write(&local, &body).expect("write");
        block_on("test", {
            let mem = mem.clone();
            let body = body.clone();
            async move { mem.put(&Key::from("out/big.json"), PutPayload::from(body)).await }
        })
        .expect("put")
        .expect("put");
        for n in 1..12 {
            let want = super::super::records::range_starts(&local, n, n, None).expect("local starts");
            assert_eq!(
                parts.line_range_starts("big.json", n, n).expect("starts"),
                want,
                "{n} ranges"
            );
        }
        let mut got = vec![];
        let mut f = parts.download_range("big.json", 5000..9000).expect("download");
        std::io::Read::read_to_end(&mut f, &mut got).expect("read");
        assert_eq!(got.len(), 9000);
        assert_eq!(&got[5000..], &body[5000..9000]);
        assert_eq!(
            parts.lines_before("big.json", 9000).expect("lines"),
            memchr::memchr_iter(b'\n', &body[..9000]).count() as u64
        );
    }

    #[test]
    fn recovery_aborts_only_the_uploads_it_owns_and_deletes_their_markers() {
        let (parts, mem) = parts();
        let dir = tempfile::tempdir().expect("tempdir");
        let local = dir.path().join("p");
        std::fs::write(&local, b"{}\n").expect("write");
        let mine = parts.stage(&local, "part-j-a-0-0.json").expect("stage");
        let _other = parts.stage(&local, "dt=2/part-k-a-0-0.json").expect("stage");
        let mine_in_partition = parts.stage(&local, "dt=2/part-j-b-1-0.json").expect("stage");
        parts
            .abort_unfinished(|name| name.starts_with(".part-j-"))
            .expect("recover");
        assert_eq!(names(&mem), ["out/dt=2/.part-k-a-0-0.json.upload"]);
        // Their uploads are gone: completing one now fails, and nothing
        // became visible.
        assert!(parts.complete(&mine).is_err());
        assert!(parts.complete(&mine_in_partition).is_err());
        assert_eq!(names(&mem), ["out/dt=2/.part-k-a-0-0.json.upload"]);
    }
}
