//! The `voices` table: a model's CosyVoice2 voices, shared by every worker of a fleet.
//!
//! Written by `voxbatch voice add|rm` and by a worker importing its model directory's own voices
//! (never overwriting); read by `voice list|show` (which also show the directory's voices not
//! imported yet) and by each worker's `voice::VoiceBook`, which polls `(name, version)` and loads
//! the rows it has not seen.
//!
//! Neighbours: `voice::prompt` (the row as data), `commands::voice`.

use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use super::{q, Db, DbError};
use crate::model::VoicePrompt;

/// Where a voice came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoiceSource {
    /// `voice add`: a recording (its sha256 and length).
    Recording,
    /// The model directory's `voices.safetensors` (the checkpoint's `spk2info.pt`).
    Checkpoint,
}

impl VoiceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            VoiceSource::Recording => "recording",
            VoiceSource::Checkpoint => "checkpoint",
        }
    }
}

/// What `voice list` shows of a voice.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct VoiceSummary {
    pub model: String,
    pub name: String,
    pub prompt_text: Option<String>,
    pub prompt_text_tokens: usize,
    pub prompt_speech_tokens: usize,
    /// Whether the voice has a zero-shot prompt (transcript tokens and speech tokens): jobs in
    /// mode `zero_shot` (the default for such a voice) need one; others run cross-lingual.
    pub zero_shot: bool,
    /// `recording` (`voice add`) or `checkpoint` (the model directory's own).
    pub source: String,
    pub source_sha256: Option<String>,
    pub source_seconds: Option<f64>,
    /// When it was stored; `None`: a model directory's voice not in Postgres yet (a worker of the
    /// model imports it when it starts).
    pub created_at: Option<DateTime<Utc>>,
}

impl VoiceSummary {
    /// A voice as `voice list` shows it, from its data (`created_at`: see the field).
    pub fn of(model: &str, voice: &VoicePrompt, source: VoiceSource, created_at: Option<DateTime<Utc>>) -> VoiceSummary {
        VoiceSummary {
            model: model.to_string(),
            name: voice.name.clone(),
            prompt_text: voice.prompt_text.clone(),
            prompt_text_tokens: voice.prompt_text_tokens.len(),
            prompt_speech_tokens: voice.speech_tokens.len(),
            zero_shot: voice.has_prompt(),
            source: source.as_str().to_string(),
            source_sha256: None,
            source_seconds: None,
            created_at,
        }
    }
}

/// Where a new voice's row comes from, besides its data.
pub struct VoiceOrigin<'a> {
    pub source: VoiceSource,
    pub sha256: Option<&'a str>,
    pub seconds: Option<f64>,
}

fn ids(v: &[i64], what: &'static str) -> Result<Vec<i32>, DbError> {
    v.iter().map(|&t| i32::try_from(t).map_err(|_| DbError::Encode { what, reason: format!("id {t} is out of range") })).collect()
}

impl Db {
    /// Stores `voice` for `model`. Without `replace` an existing voice of that name is kept and
    /// `false` returned; with it the row is overwritten (a new version: workers reload it).
    pub async fn put_voice(&self, model: &str, voice: &VoicePrompt, origin: &VoiceOrigin<'_>, replace: bool) -> Result<bool, DbError> {
        let conflict = if replace {
            "ON CONFLICT (model, name) DO UPDATE SET prompt_text = EXCLUDED.prompt_text,
                 prompt_text_tokens = EXCLUDED.prompt_text_tokens, prompt_speech_tokens = EXCLUDED.prompt_speech_tokens,
                 flow_prompt_tokens = EXCLUDED.flow_prompt_tokens, prompt_mel = EXCLUDED.prompt_mel,
                 embedding = EXCLUDED.embedding, source = EXCLUDED.source, source_sha256 = EXCLUDED.source_sha256,
                 source_seconds = EXCLUDED.source_seconds, version = EXCLUDED.version, created_at = now()"
        } else {
            "ON CONFLICT (model, name) DO NOTHING"
        };
        let sql = format!(
            "INSERT INTO voices (model, name, prompt_text, prompt_text_tokens, prompt_speech_tokens, flow_prompt_tokens,
                 prompt_mel, embedding, source, source_sha256, source_seconds, version)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) {conflict}"
        );
        let flow = voice.flow_tokens.as_deref().map(|f| ids(f, "flow prompt tokens")).transpose()?;
        let done = sqlx::query(&sql)
            .bind(model)
            .bind(&voice.name)
            .bind(&voice.prompt_text)
            .bind(ids(&voice.prompt_text_tokens, "prompt text tokens")?)
            .bind(ids(&voice.speech_tokens, "prompt speech tokens")?)
            .bind(flow)
            .bind(&voice.prompt_mel)
            .bind(&voice.embedding)
            .bind(origin.source.as_str())
            .bind(origin.sha256)
            .bind(origin.seconds)
            .bind(Uuid::new_v4())
            .execute(&self.pool)
            .await
            .map_err(q("store voice"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Every voice of `model` (all models when `None`), by model and name.
    pub async fn list_voices(&self, model: Option<&str>) -> Result<Vec<VoiceSummary>, DbError> {
        let rows = sqlx::query(
            "SELECT model, name, prompt_text, cardinality(prompt_text_tokens) AS text_tokens,
                    cardinality(prompt_speech_tokens) AS speech_tokens, source, source_sha256, source_seconds, created_at
             FROM voices WHERE $1::text IS NULL OR model = $1 ORDER BY model, name",
        )
        .bind(model)
        .fetch_all(&self.pool)
        .await
        .map_err(q("list voices"))?;
        rows.iter()
            .map(|r| {
                let (text_tokens, speech_tokens) =
                    (r.try_get::<i32, _>("text_tokens")?.max(0) as usize, r.try_get::<i32, _>("speech_tokens")?.max(0) as usize);
                Ok(VoiceSummary {
                    model: r.try_get("model")?,
                    name: r.try_get("name")?,
                    prompt_text: r.try_get("prompt_text")?,
                    prompt_text_tokens: text_tokens,
                    prompt_speech_tokens: speech_tokens,
                    // As `VoicePrompt::has_prompt`.
                    zero_shot: text_tokens > 0 && speech_tokens > 0,
                    source: r.try_get("source")?,
                    source_sha256: r.try_get("source_sha256")?,
                    source_seconds: r.try_get("source_seconds")?,
                    created_at: Some(r.try_get("created_at")?),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(q("read voices"))
    }

    /// Each voice of `model` with its version: what a worker polls.
    pub async fn voice_versions(&self, model: &str) -> Result<Vec<(String, Uuid)>, DbError> {
        sqlx::query_as("SELECT name, version FROM voices WHERE model = $1")
            .bind(model)
            .fetch_all(&self.pool)
            .await
            .map_err(q("poll voices"))
    }

    /// The voices `names` of `model`, whole, with their versions.
    pub async fn load_voices(&self, model: &str, names: &[String]) -> Result<Vec<(VoicePrompt, Uuid)>, DbError> {
        let rows = sqlx::query(
            "SELECT name, prompt_text, prompt_text_tokens, prompt_speech_tokens, flow_prompt_tokens, prompt_mel, embedding, version
             FROM voices WHERE model = $1 AND name = ANY($2)",
        )
        .bind(model)
        .bind(names)
        .fetch_all(&self.pool)
        .await
        .map_err(q("load voices"))?;
        let widen = |v: Vec<i32>| v.into_iter().map(i64::from).collect::<Vec<i64>>();
        rows.into_iter()
            .map(|r| {
                let voice = VoicePrompt {
                    name: r.try_get("name")?,
                    prompt_text: r.try_get("prompt_text")?,
                    prompt_text_tokens: widen(r.try_get("prompt_text_tokens")?),
                    speech_tokens: widen(r.try_get("prompt_speech_tokens")?),
                    flow_tokens: r.try_get::<Option<Vec<i32>>, _>("flow_prompt_tokens")?.map(widen),
                    prompt_mel: r.try_get("prompt_mel")?,
                    embedding: r.try_get("embedding")?,
                };
                Ok((voice, r.try_get("version")?))
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(q("read voices"))
    }

    /// Removes voice `name` of `model`; `false` when there was none.
    pub async fn remove_voice(&self, model: &str, name: &str) -> Result<bool, DbError> {
        let done = sqlx::query("DELETE FROM voices WHERE model = $1 AND name = $2")
            .bind(model)
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(q("remove voice"))?;
        Ok(done.rows_affected() == 1)
    }
}
