//! Delta tables on object stores through Weir's own stores.
//!
//! delta-rs finds a table's store by its URL's scheme in a process-wide
//! registry (`deltalake-aws` and friends fill it from storage options).
//! Weir registers itself for the object-store schemes instead and hands
//! out the bucket stores the sinks opened with the job's `s3.*` settings
//! (the same client, credentials and endpoint as checkpoints and the
//! filesystem connector): one configuration, and no second S3 stack. The
//! log store is delta-rs's default one, whose commits are conditional PUTs
//! (`If-None-Match: *`), which S3 and the compatible servers keep atomic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use deltalake_core::logstore::{
    LogStore, LogStoreFactory, ObjectStoreFactory, ObjectStoreRef, StorageConfig, default_logstore, logstore_factories,
    object_store_factories,
};
use deltalake_core::{DeltaResult, DeltaTableError};
use object_store::path::Path as Key;
use url::Url;

/// The schemes of the object stores `checkpoint::objects::open_bucket`
/// opens.
const SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "azure", "abfs", "abfss"];

/// Bucket stores by `scheme://bucket`, as the sinks opened them.
fn buckets() -> &'static Mutex<HashMap<String, ObjectStoreRef>> {
    static BUCKETS: OnceLock<Mutex<HashMap<String, ObjectStoreRef>>> = OnceLock::new();
    BUCKETS.get_or_init(Default::default)
}

fn bucket_key(url: &Url) -> String {
    format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default())
}

/// Makes `store` (rooted at the bucket of `url`) the one delta-rs uses for
/// every table in that bucket, in this process. A process has one set of
/// `s3.*` settings, so the last store opened is as good as the first.
pub fn register(url: &Url, store: ObjectStoreRef) {
    static FACTORIES: OnceLock<()> = OnceLock::new();
    FACTORIES.get_or_init(|| {
        for scheme in SCHEMES {
            let Ok(u) = Url::parse(&format!("{scheme}://")) else {
                continue;
            };
            object_store_factories().insert(u.clone(), Arc::new(WeirStores));
            logstore_factories().insert(u, Arc::new(WeirLogStores));
        }
    });
    if let Ok(mut b) = buckets().lock() {
        b.insert(bucket_key(url), store);
    }
}

struct WeirStores;

impl ObjectStoreFactory for WeirStores {
    fn parse_url_opts(&self, url: &Url, _config: &StorageConfig) -> DeltaResult<(ObjectStoreRef, Key)> {
        let store = buckets()
            .lock()
            .ok()
            .and_then(|b| b.get(&bucket_key(url)).cloned())
            .ok_or_else(|| {
                DeltaTableError::InvalidTableLocation(format!(
                    "{url}: no store is open for its bucket (a Delta table on an object store is reached through a sink's 'path')"
                ))
            })?;
        let key = Key::from_url_path(url.path())?;
        Ok((store, key))
    }
}

struct WeirLogStores;

impl LogStoreFactory for WeirLogStores {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> DeltaResult<Arc<dyn LogStore>> {
        Ok(default_logstore(prefixed_store, root_store, location, options))
    }
}
