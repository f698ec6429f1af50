//! `file://DIR`: audio on a local or mounted filesystem, metadata (with the Content-Type) in
//! `<key>.meta.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{AudioMeta, StorageError};

#[derive(Clone, Debug)]
pub struct FileStore {
    root: PathBuf,
    key_prefix: String,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StorageError + 'a {
    move |source| StorageError::File { op, path: path.display().to_string(), source }
}

impl FileStore {
    pub fn new(root: PathBuf, key_prefix: String) -> FileStore {
        FileStore { root, key_prefix }
    }
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }
    pub fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    pub async fn ensure_root(&self) -> Result<(), StorageError> {
        tokio::fs::create_dir_all(&self.root).await.map_err(io("create", &self.root))
    }

    /// Writes through a temporary file and a rename, so a reader never sees half a file.
    pub async fn put(&self, key: &str, body: Vec<u8>, meta: &AudioMeta) -> Result<(), StorageError> {
        let path = self.path(key);
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir).await.map_err(io("create", dir))?;
        }
        let meta_path = PathBuf::from(format!("{}.meta.json", path.display()));
        // The Content-Type S3 keeps beside the object, kept here in the metadata file.
        let mut map = meta.to_map();
        map.insert("content-type".to_string(), meta.content_type.to_string());
        let meta_json = serde_json::to_vec_pretty(&map)
            .map_err(|source| StorageError::Corrupt { key: key.to_string(), source })?;
        for (p, bytes) in [(&meta_path, meta_json), (&path, body)] {
            let tmp = PathBuf::from(format!("{}.tmp-{}", p.display(), uuid::Uuid::new_v4()));
            tokio::fs::write(&tmp, bytes).await.map_err(io("write", &tmp))?;
            tokio::fs::rename(&tmp, p).await.map_err(io("rename", p))?;
        }
        Ok(())
    }

    pub async fn get(&self, key: &str) -> Result<(Vec<u8>, BTreeMap<String, String>), StorageError> {
        let path = self.path(key);
        let body = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StorageError::NotFound(key.to_string())),
            Err(e) => return Err(io("read", &path)(e)),
        };
        let meta_path = PathBuf::from(format!("{}.meta.json", path.display()));
        let meta = tokio::fs::read(&meta_path).await.map_err(io("read", &meta_path))?;
        let meta = serde_json::from_slice(&meta).map_err(|source| StorageError::Corrupt { key: key.to_string(), source })?;
        Ok((body, meta))
    }

    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StorageError> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let mut rd = match tokio::fs::read_dir(&dir).await {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io("list", &dir)(e)),
            };
            while let Some(entry) = rd.next_entry().await.map_err(io("list", &dir))? {
                let p = entry.path();
                if p.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(&self.root) {
                    let key = rel.to_string_lossy().to_string();
                    if key.starts_with(prefix) && is_audio_key(&key) {
                        let size = entry.metadata().await.map_err(io("list", &p))?.len();
                        out.push((key, size));
                    }
                }
            }
        }
        out.sort();
        Ok(out)
    }

    pub async fn delete(&self, key: &str) -> Result<(), StorageError> {
        let p = self.path(key);
        let meta = PathBuf::from(format!("{}.meta.json", p.display()));
        match tokio::fs::remove_file(&meta).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("delete", &meta)(e)),
            _ => {}
        }
        tokio::fs::remove_file(&p).await.map_err(io("delete", &p))
    }
}

/// Whether `key` names an audio object (not its `.meta.json` or a temporary file).
fn is_audio_key(key: &str) -> bool {
    crate::audio::OutputFormat::ALL.iter().any(|f| key.strip_suffix(f.extension()).is_some_and(|k| k.ends_with('.')))
}
