//! The persistent catalog: every table and view of a data dir, kept in one
//! JSON file that is replaced atomically on every change.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{CatalogError, TableDef, ViewDef};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    Table(TableDef),
    View(ViewDef),
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CatalogFile {
    version: u32,
    entries: BTreeMap<String, Entry>,
}

const FORMAT_VERSION: u32 = 1;

/// Tables and views by name. With a path, every change is written to disk
/// before it is visible, so a crash never loses an accepted `CREATE`.
#[derive(Debug, Default)]
pub struct Catalog {
    path: Option<PathBuf>,
    entries: BTreeMap<String, Entry>,
}

impl Catalog {
    /// A catalog that lives only as long as the session.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// An in-memory catalog of this one's entries with `over`'s in their
    /// place where both have a name (a session's temporary objects shadow
    /// permanent ones, as in Flink).
    pub fn overlaid(&self, over: &Catalog) -> Catalog {
        let mut entries = self.entries.clone();
        for (name, entry) in &over.entries {
            entries.insert(name.clone(), entry.clone());
        }
        Catalog { path: None, entries }
    }

    /// Puts `entry` under `key` (which may differ from its name: a
    /// table read with a query's dynamic options), in memory only.
    pub fn insert(&mut self, key: String, entry: Entry) {
        self.entries.insert(key, entry);
    }

    /// Whether the catalog has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Opens (or creates) the catalog file at `path`.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, CatalogError> {
        let path = path.into();
        let entries = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: CatalogFile = serde_json::from_slice(&bytes).map_err(|e| CatalogError::Corrupt {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                if file.version != FORMAT_VERSION {
                    return Err(CatalogError::Corrupt {
                        path,
                        message: format!(
                            "format version {} is not supported (expected {FORMAT_VERSION})",
                            file.version
                        ),
                    });
                }
                file.entries
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => return Err(CatalogError::Io { path, source }),
        };
        Ok(Self {
            path: Some(path),
            entries,
        })
    }

    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    pub fn table(&self, name: &str) -> Option<&TableDef> {
        match self.entries.get(name) {
            Some(Entry::Table(t)) => Some(t),
            _ => None,
        }
    }

    pub fn entries(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter()
    }

    pub fn create(&mut self, entry: Entry, if_not_exists: bool) -> Result<(), CatalogError> {
        let name = match &entry {
            Entry::Table(t) => t.name.clone(),
            Entry::View(v) => v.name.clone(),
        };
        if self.entries.contains_key(&name) {
            return if if_not_exists {
                Ok(())
            } else {
                Err(CatalogError::AlreadyExists(name))
            };
        }
        let mut next = self.entries.clone();
        next.insert(name, entry);
        self.commit(next)
    }

    /// Removes `name`; `Ok(false)` when it did not exist and `if_exists`.
    pub fn drop(&mut self, name: &str, if_exists: bool) -> Result<bool, CatalogError> {
        if !self.entries.contains_key(name) {
            return if if_exists {
                Ok(false)
            } else {
                Err(CatalogError::NotFound(name.to_string()))
            };
        }
        let mut next = self.entries.clone();
        next.remove(name);
        self.commit(next)?;
        Ok(true)
    }

    /// Replaces `old` by `entry` (under its own name, which may differ: a
    /// rename) in one write of the catalog file.
    pub fn replace(&mut self, old: &str, entry: Entry) -> Result<(), CatalogError> {
        if !self.entries.contains_key(old) {
            return Err(CatalogError::NotFound(old.to_string()));
        }
        let name = match &entry {
            Entry::Table(t) => t.name.clone(),
            Entry::View(v) => v.name.clone(),
        };
        if name != old && self.entries.contains_key(&name) {
            return Err(CatalogError::AlreadyExists(name));
        }
        let mut next = self.entries.clone();
        next.remove(old);
        next.insert(name, entry);
        self.commit(next)
    }

    fn commit(&mut self, next: BTreeMap<String, Entry>) -> Result<(), CatalogError> {
        if let Some(path) = &self.path {
            write_atomically(path, &next)?;
        }
        self.entries = next;
        Ok(())
    }
}

fn write_atomically(path: &Path, entries: &BTreeMap<String, Entry>) -> Result<(), CatalogError> {
    let io = |source| CatalogError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = CatalogFile {
        version: FORMAT_VERSION,
        entries: entries.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&file).map_err(|e| CatalogError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str) -> Entry {
        Entry::View(ViewDef {
            name: name.into(),
            query: "SELECT 1".into(),
        })
    }

    #[test]
    fn survives_reopen_and_rejects_duplicates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("catalog.json");
        let mut c = Catalog::open(&path).expect("open");
        c.create(view("v"), false).expect("create");
        assert!(matches!(
            c.create(view("v"), false),
            Err(CatalogError::AlreadyExists(_))
        ));
        c.create(view("v"), true).expect("if not exists");
        let c2 = Catalog::open(&path).expect("reopen");
        assert!(c2.get("v").is_some());
    }

    #[test]
    fn replace_renames_in_the_file_and_refuses_an_existing_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("catalog.json");
        let mut c = Catalog::open(&path).expect("open");
        c.create(view("a"), false).expect("a");
        c.create(view("b"), false).expect("b");
        assert!(matches!(c.replace("a", view("b")), Err(CatalogError::AlreadyExists(_))));
        assert!(matches!(c.replace("nope", view("x")), Err(CatalogError::NotFound(_))));
        c.replace("a", view("c")).expect("rename");
        let c2 = Catalog::open(&path).expect("reopen");
        assert!(c2.get("a").is_none() && c2.get("b").is_some() && c2.get("c").is_some());
    }

    #[test]
    fn corrupt_file_is_a_typed_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("catalog.json");
        std::fs::write(&path, b"{not json").expect("write");
        let err = Catalog::open(&path).expect_err("must fail");
        assert!(err.to_string().contains("corrupt"), "{err}");
    }
}
