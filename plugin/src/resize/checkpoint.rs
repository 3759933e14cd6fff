//! Durable records of in-flight resizes in the state directory (`--state-dir`), so a restarted
//! plugin resumes them and never applies one twice.
//!
//! Each record is one JSON file, written atomically: a temp file in the same directory, fsync,
//! rename over the old record, fsync of the directory. A reader therefore sees the old record or
//! the new one, never a torn write. Files that do not parse are moved aside as `*.corrupt` and
//! reported, never silently dropped.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A checkpoint could not be written, read or removed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("state directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "checkpoint key {key:?} is not a safe file name (letters, digits, '.', '_', '-'; 1..=128)"
    )]
    BadKey { key: String },
    #[error("writing checkpoint {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding checkpoint {key}: {source}")]
    Encode {
        key: String,
        source: serde_json::Error,
    },
    #[error("checkpoint {path} is corrupt ({source}); moved aside to {moved_to}")]
    Corrupt {
        path: PathBuf,
        moved_to: PathBuf,
        source: serde_json::Error,
    },
    #[error("reading checkpoint {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

const SUFFIX: &str = ".json";

/// See the module docs.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
}

fn valid_key(key: &str) -> bool {
    (1..=128).contains(&key.len())
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl CheckpointStore {
    /// Opens (creating, mode 0700) the state directory and checks that it is writable.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let dir = dir.as_ref().to_path_buf();
        let err = |source| CheckpointError::Dir {
            path: dir.clone(),
            source,
        };
        if !dir.exists() {
            fs::create_dir_all(&dir).map_err(err)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(err)?;
        }
        let probe = dir.join(".probe");
        File::create(&probe)
            .and_then(|f| f.sync_all())
            .map_err(err)?;
        fs::remove_file(&probe).map_err(err)?;
        Ok(CheckpointStore { dir })
    }

    fn path(&self, key: &str) -> Result<PathBuf, CheckpointError> {
        if !valid_key(key) {
            return Err(CheckpointError::BadKey {
                key: key.to_string(),
            });
        }
        Ok(self.dir.join(format!("{key}{SUFFIX}")))
    }

    /// Writes (or replaces) the record `key` atomically.
    pub fn save<T: Serialize>(&self, key: &str, value: &T) -> Result<(), CheckpointError> {
        let path = self.path(key)?;
        let bytes = serde_json::to_vec_pretty(value).map_err(|source| CheckpointError::Encode {
            key: key.to_string(),
            source,
        })?;
        let tmp = self.dir.join(format!(".{key}.tmp"));
        let werr = |source| CheckpointError::Write {
            path: path.clone(),
            source,
        };
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(werr)?;
            f.write_all(&bytes).map_err(werr)?;
            f.sync_all().map_err(werr)?;
        }
        fs::rename(&tmp, &path).map_err(werr)?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(werr)?;
        Ok(())
    }

    /// Removes the record `key` (absent is fine).
    pub fn remove(&self, key: &str) -> Result<(), CheckpointError> {
        let path = self.path(key)?;
        match fs::remove_file(&path) {
            Ok(()) => File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|source| CheckpointError::Write { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CheckpointError::Write { path, source }),
        }
    }

    /// Every record that parses, and an error for every one that does not (moved aside).
    pub fn load_all<T: DeserializeOwned>(&self) -> (Vec<(String, T)>, Vec<CheckpointError>) {
        self.load_prefixed("")
    }

    /// Like [`Self::load_all`], for the keys starting with `prefix` (one kind of record).
    pub fn load_prefixed<T: DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> (Vec<(String, T)>, Vec<CheckpointError>) {
        let mut records = Vec::new();
        let mut errors = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(source) => {
                errors.push(CheckpointError::Dir {
                    path: self.dir.clone(),
                    source,
                });
                return (records, errors);
            }
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(key) = name.strip_suffix(SUFFIX) else {
                continue;
            };
            if !valid_key(key) || !key.starts_with(prefix) {
                continue;
            }
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                Err(source) => {
                    errors.push(CheckpointError::Read { path, source });
                    continue;
                }
            };
            match serde_json::from_slice(&bytes) {
                Ok(v) => records.push((key.to_string(), v)),
                Err(source) => {
                    let moved_to = path.with_extension("corrupt");
                    let _ = fs::rename(&path, &moved_to);
                    errors.push(CheckpointError::Corrupt {
                        path,
                        moved_to,
                        source,
                    });
                }
            }
        }
        (records, errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Rec {
        pod: String,
        step: u32,
    }

    #[test]
    fn save_replace_load_remove() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path().join("state")).unwrap();
        store
            .save(
                "pod-1",
                &Rec {
                    pod: "a".into(),
                    step: 1,
                },
            )
            .unwrap();
        store
            .save(
                "pod-1",
                &Rec {
                    pod: "a".into(),
                    step: 2,
                },
            )
            .unwrap();
        store
            .save(
                "pod-2",
                &Rec {
                    pod: "b".into(),
                    step: 0,
                },
            )
            .unwrap();
        let (recs, errs) = store.load_all::<Rec>();
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(
            recs,
            vec![
                (
                    "pod-1".to_string(),
                    Rec {
                        pod: "a".into(),
                        step: 2
                    }
                ),
                (
                    "pod-2".to_string(),
                    Rec {
                        pod: "b".into(),
                        step: 0
                    }
                )
            ]
        );
        store.remove("pod-1").unwrap();
        store.remove("pod-1").unwrap();
        assert_eq!(store.load_all::<Rec>().0.len(), 1);
        let mode = fs::metadata(dir.path().join("state"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn corrupt_records_are_reported_and_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path()).unwrap();
        store
            .save(
                "good",
                &Rec {
                    pod: "a".into(),
                    step: 1,
                },
            )
            .unwrap();
        fs::write(dir.path().join("bad.json"), b"{\"pod\": \"x\", \"st").unwrap();
        let (recs, errs) = store.load_all::<Rec>();
        assert_eq!(recs.len(), 1);
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].to_string().contains("bad.json") && errs[0].to_string().contains("corrupt"),
            "{}",
            errs[0]
        );
        assert!(dir.path().join("bad.corrupt").exists());
        assert!(
            store.load_all::<Rec>().1.is_empty(),
            "reported once, not on every load"
        );
    }

    #[test]
    fn unsafe_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path()).unwrap();
        for key in ["", "../x", "a/b", ".hidden", &"x".repeat(200)] {
            assert!(
                matches!(store.save(key, &1), Err(CheckpointError::BadKey { .. })),
                "{key:?}"
            );
        }
    }

    #[test]
    fn an_unwritable_state_dir_is_a_clear_error() {
        let err = CheckpointStore::open("/proc/nri-resize-state").unwrap_err();
        assert!(err.to_string().contains("/proc/nri-resize-state"), "{err}");
    }
}
