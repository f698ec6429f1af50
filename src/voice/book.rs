//! A worker's voices ([`VoiceBook`]): which voice names its jobs may use, the index each has on
//! the model thread, and the tokens its prompt adds to a job.
//!
//! A TorchScript model's voices are fixed by its directory. A CosyVoice2 model's live in Postgres
//! (`voices`, shared by the fleet): at start the worker imports its directory's own voices (never
//! overwriting), loads every voice of its model, and hands each to the model thread
//! (`ModelHandle::set_voice`, which checks it against the manifest and does not wait for the
//! model's load) before publishing it, so no batch names an index the thread lacks.
//! It then polls `(name, version)` every `voices.refresh`, and at once when a job names a voice
//! it does not know ([`VoiceBook::refresh_after`]: one query answers every job that was waiting).
//! A replaced voice gets a new index (batches already formed keep the old prompt); a removed one
//! is forgotten; a stored voice the model cannot use (a prompt outside its tables) is refused with
//! that reason.
//!
//! Lookups are lock-free (`arc_swap`): the intake calls them on the async runtime.
//!
//! Neighbours: `worker::intake` (looks up each job's voice), `db::voices`, `model` (the thread's
//! voice table), `prompt` (the data).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use tracing::{info, warn};
use uuid::Uuid;

use super::prompt::{checkpoint_voices, VoicePrompt};
use crate::db::{Db, DbError, VoiceOrigin, VoiceSource};
use crate::model::{Manifest, ModelError, ModelHandle};

/// A usable voice: its index on the model thread and the tokens its prompt adds to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookEntry {
    pub index: i64,
    pub prompt_tokens: usize,
}

/// What the book says of a voice name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(BookEntry),
    /// Stored, but the model cannot use it: why.
    Unusable(String),
    Unknown,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BookError {
    #[error("voices: postgres")]
    Db(#[from] DbError),
    #[error("voices: the model")]
    Model(#[from] ModelError),
}

impl crate::transience::Transience for BookError {
    fn is_permanent(&self) -> bool {
        match self {
            BookError::Db(e) => e.is_permanent(),
            BookError::Model(e) => matches!(e, ModelError::ThreadGone | ModelError::NotLoaded(_) | ModelError::Manifest { .. }),
        }
    }
}

#[derive(Debug, Clone)]
struct Known {
    version: Option<Uuid>,
    entry: Result<BookEntry, String>,
}

/// The voices a model's jobs may name.
pub struct VoiceBook {
    names: ArcSwap<HashMap<String, Known>>,
    shared: Option<Shared>,
}

/// A CosyVoice2 book's way to Postgres and the model thread.
struct Shared {
    db: Db,
    model: ModelHandle,
    model_name: String,
    /// Held across a refresh, so that refreshes run one at a time.
    state: tokio::sync::Mutex<RefreshState>,
}

/// What refreshes share.
#[derive(Default)]
struct RefreshState {
    /// When the last successful refresh started.
    last_started: Option<Instant>,
    /// The next free voice index on the model thread.
    next_index: usize,
}

impl VoiceBook {
    /// A model's voices as its directory fixes them (TorchScript: speaker indices).
    pub fn fixed(manifest: &Manifest) -> VoiceBook {
        let names = manifest
            .voices
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let entry = BookEntry { index: i as i64, prompt_tokens: manifest.prompt_tokens(i as i64) };
                (name.clone(), Known { version: None, entry: Ok(entry) })
            })
            .collect();
        VoiceBook { names: ArcSwap::from_pointee(names), shared: None }
    }

    /// A CosyVoice2 model's voices from Postgres: imports the directory's own voices (existing
    /// rows win), then loads every voice of the model onto its thread.
    pub async fn shared(db: Db, model: ModelHandle) -> Result<VoiceBook, BookError> {
        let manifest = model.manifest().clone();
        let dir = manifest.dir.clone();
        let own = tokio::task::spawn_blocking(move || checkpoint_voices(&dir, &manifest))
            .await
            .map_err(|_| ModelError::ThreadGone)??;
        let model_name = model.manifest().name.clone();
        let origin = VoiceOrigin { source: VoiceSource::Checkpoint, sha256: None, seconds: None };
        for voice in &own {
            if crate::job::check_name(&voice.name).is_err() {
                warn!(voice = %voice.name, "the model directory's voice has a name jobs cannot use; not imported");
                continue;
            }
            if db.put_voice(&model_name, voice, &origin, false).await? {
                info!(model = %model_name, voice = %voice.name, "imported the model directory's voice");
            }
        }
        let book = VoiceBook {
            names: ArcSwap::from_pointee(HashMap::new()),
            shared: Some(Shared { db, model, model_name, state: tokio::sync::Mutex::default() }),
        };
        book.refresh().await?;
        Ok(book)
    }

    pub fn lookup(&self, name: &str) -> Lookup {
        match self.names.load().get(name).map(|k| &k.entry) {
            Some(Ok(entry)) => Lookup::Found(*entry),
            Some(Err(why)) => Lookup::Unusable(why.clone()),
            None => Lookup::Unknown,
        }
    }

    /// The usable voice names, sorted (what a rejection lists).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.names.load().iter().filter(|(_, k)| k.entry.is_ok()).map(|(n, _)| n.clone()).collect();
        names.sort();
        names
    }

    /// Whether the book can learn new voices (CosyVoice2) or is fixed (TorchScript).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Makes sure a refresh started after `since` has finished: a job received at `since` naming
    /// an unknown voice is refused only if that voice was not in Postgres when it arrived.
    pub async fn refresh_after(&self, since: Instant) -> Result<(), BookError> {
        let Some(shared) = &self.shared else { return Ok(()) };
        let mut state = shared.state.lock().await;
        if state.last_started.is_some_and(|started| started >= since) {
            return Ok(());
        }
        self.refresh_locked(shared, &mut state).await
    }

    /// Loads voices added or replaced since the last look and forgets removed ones.
    pub async fn refresh(&self) -> Result<(), BookError> {
        let Some(shared) = &self.shared else { return Ok(()) };
        let mut state = shared.state.lock().await;
        self.refresh_locked(shared, &mut state).await
    }

    async fn refresh_locked(&self, shared: &Shared, state: &mut RefreshState) -> Result<(), BookError> {
        let started = Instant::now();
        let stored: HashMap<String, Uuid> = shared.db.voice_versions(&shared.model_name).await?.into_iter().collect();
        let current = self.names.load_full();
        let changed: Vec<String> =
            stored.iter().filter(|(name, version)| current.get(*name).and_then(|k| k.version) != Some(**version)).map(|(n, _)| n.clone()).collect();
        let removed = current.keys().any(|name| !stored.contains_key(name));
        if changed.is_empty() && !removed {
            state.last_started = Some(started);
            return Ok(());
        }
        let mut next: HashMap<String, Known> =
            current.iter().filter(|(name, _)| stored.contains_key(*name)).map(|(n, k)| (n.clone(), k.clone())).collect();
        for (voice, version) in shared.db.load_voices(&shared.model_name, &changed).await? {
            let name = voice.name.clone();
            let entry = self.place(shared, state, voice)?;
            match &entry {
                Ok(e) => info!(voice = %name, index = e.index, "voice loaded"),
                Err(why) => warn!(voice = %name, reason = %why, "voice stored but not usable by this model"),
            }
            next.insert(name, Known { version: Some(version), entry });
        }
        self.names.store(Arc::new(next));
        state.last_started = Some(started);
        Ok(())
    }

    /// Hands `voice` to the model thread at the next free index (without waiting for it, nor for
    /// its load: `ModelHandle::set_voice`); `Ok(Err(why))` when the model cannot use the voice
    /// (bad data, checked against its manifest), `Err` when the thread is gone.
    fn place(&self, shared: &Shared, state: &mut RefreshState, voice: VoicePrompt) -> Result<Result<BookEntry, String>, BookError> {
        let index = state.next_index;
        let prompt_tokens = voice.flow_tokens().len();
        match shared.model.set_voice(index, voice) {
            Ok(()) => {
                state.next_index += 1;
                Ok(Ok(BookEntry { index: index as i64, prompt_tokens }))
            }
            Err(ModelError::BadInput(why)) => Ok(Err(why)),
            Err(e) => Err(e.into()),
        }
    }
}
