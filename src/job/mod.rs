//! The job message: the public wire format and its validation.
//!
//! Input: the raw bytes of an AMQP message body. Output: a [`Job`], or a [`Rejection`] that says
//! exactly why the message can never be processed (it is dead-lettered with that reason by the
//! worker, never retried). The size limit is checked before any parsing. `docs/job.schema.json`
//! describes the same format for other clients.
//!
//! Neighbours: `queue` delivers the bytes and publishes `enqueue`'s jobs; `worker` calls
//! [`parse_job`] for each delivery.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::config::Limits;

mod json;

/// Default `voice` and `campaign` when a message leaves them out.
pub const DEFAULT_VOICE: &str = "default";
pub const DEFAULT_CAMPAIGN: &str = "default";
const MAX_NAME_LEN: usize = 128;

/// A validated synthesis job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub job_id: Uuid,
    /// The text (may be empty when the job carries `speech_tokens`).
    pub text: String,
    /// Speech tokens for a model that synthesizes them (CosyVoice2 token2wav): ids from
    /// CosyVoice2's LLM or speech tokenizer, 25 a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speech_tokens: Option<Vec<i64>>,
    pub voice: String,
    pub campaign: String,
    pub priority: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// How a CosyVoice2 text job uses its voice (other models ignore it); `None`: the model's
    /// default for the voice (zero-shot when it has a prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The instruction of mode `instruct` ("用开心的语气说", "Speak slowly").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
    /// The stored audio's file format; `None`: `[output] format`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<crate::audio::OutputFormat>,
    /// How fast a CosyVoice2 job is spoken ([`MIN_SPEED`]..=[`MAX_SPEED`]; `None`: 1): its mel
    /// stretched before the vocoder, as upstream's `speed` does. Other models refuse it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<f64>,
}

/// The slowest and fastest `speed` a job may ask for.
pub const MIN_SPEED: f64 = 0.5;
pub const MAX_SPEED: f64 = 2.0;

/// CosyVoice2's inference modes for a registered voice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The LLM continues the voice's prompt (its text and speech tokens): the voice's timbre and style.
    ZeroShot,
    /// The LLM gets neither prompt text nor prompt speech tokens (text in another language than
    /// the prompt's); the flow still gets the voice.
    CrossLingual,
    /// CosyVoice2's instruct2: the LLM's prompt text is the job's `instruction`, no prompt speech tokens.
    Instruct,
}

impl Mode {
    /// Its name on the wire (and in `jobs.mode`).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ZeroShot => "zero_shot",
            Mode::CrossLingual => "cross_lingual",
            Mode::Instruct => "instruct",
        }
    }
}

/// Characters an `instruction` may have.
pub const MAX_INSTRUCTION_CHARS: usize = 500;

impl Job {
    /// A new job with a fresh id and defaults.
    pub fn new(text: impl Into<String>) -> Job {
        Job {
            job_id: Uuid::new_v4(),
            text: text.into(),
            speech_tokens: None,
            voice: DEFAULT_VOICE.to_string(),
            campaign: DEFAULT_CAMPAIGN.to_string(),
            priority: 0,
            metadata: None,
            mode: None,
            instruction: None,
            format: None,
            speed: None,
        }
    }

    /// Characters (Unicode scalar values) of the text.
    pub fn chars(&self) -> usize {
        self.text.chars().count()
    }

    /// The JSON body published to the queue.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising a struct of strings, integers and a JSON map cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Why a message was rejected. `job_id` is set whenever one could be read, so that a `rejected`
/// row can be written for it, and `campaign` whenever the message names a valid one, so that the
/// row is filed under it (`status --campaign` counts it, its drain event names it).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind}")]
pub struct Rejection {
    pub job_id: Option<Uuid>,
    pub campaign: Option<String>,
    pub kind: RejectionKind,
}

impl Rejection {
    /// A valid job refused for `kind` (its voice, its content against a stored one, its model).
    pub fn of(job: &Job, kind: RejectionKind) -> Rejection {
        Rejection { job_id: Some(job.job_id), campaign: Some(job.campaign.clone()), kind }
    }
}

/// The reasons a message can never be processed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RejectionKind {
    #[error("message is {bytes} bytes, over the limit of {limit}")]
    TooLarge { bytes: usize, limit: usize },
    #[error("message is not valid UTF-8 (at byte {at})")]
    NotUtf8 { at: usize },
    #[error("message is not JSON: {0}")]
    NotJson(String),
    #[error("message is JSON but not an object")]
    NotObject,
    #[error("`job_id` is missing")]
    MissingJobId,
    #[error("`job_id` is not a UUID string: {0}")]
    InvalidJobId(String),
    #[error("`text` is missing")]
    MissingText,
    #[error("`text` is not a string")]
    TextNotString,
    #[error("`text` is empty or only whitespace")]
    EmptyText,
    #[error("`text` contains a NUL character (at char {at})")]
    NulInText { at: usize },
    #[error("`text` has {chars} characters, over the limit of {limit}")]
    TextTooLong { chars: usize, limit: usize },
    #[error("`{field}` is invalid: {reason}")]
    InvalidField { field: &'static str, reason: String },
    #[error("`speech_tokens` is invalid: {0}")]
    InvalidSpeechTokens(String),
    #[error("this model synthesizes speech tokens: the job needs `speech_tokens` (an array of token ids)")]
    MissingSpeechTokens,
    #[error("unknown voice `{voice}` (this model has: {known})")]
    UnknownVoice { voice: String, known: String },
    #[error("job {job_id} was already submitted with a different {field}")]
    Conflict { job_id: Uuid, field: &'static str },
    #[error("`text` says nothing once normalised: {0}")]
    NothingToSay(String),
    #[error("delivered {deliveries} times without finishing (a worker crashed or lost its broker connection each time); not tried again")]
    DeliveryLimit { deliveries: u64 },
}

impl RejectionKind {
    /// A short machine-readable code, stored beside the human-readable reason.
    pub fn code(&self) -> &'static str {
        match self {
            RejectionKind::TooLarge { .. } => "too_large",
            RejectionKind::NotUtf8 { .. } => "not_utf8",
            RejectionKind::NotJson(_) => "not_json",
            RejectionKind::NotObject => "not_object",
            RejectionKind::MissingJobId => "missing_job_id",
            RejectionKind::InvalidJobId(_) => "invalid_job_id",
            RejectionKind::MissingText => "missing_text",
            RejectionKind::TextNotString => "text_not_string",
            RejectionKind::EmptyText => "empty_text",
            RejectionKind::NulInText { .. } => "nul_in_text",
            RejectionKind::TextTooLong { .. } => "text_too_long",
            RejectionKind::InvalidField { .. } => "invalid_field",
            RejectionKind::InvalidSpeechTokens(_) => "invalid_speech_tokens",
            RejectionKind::MissingSpeechTokens => "missing_speech_tokens",
            RejectionKind::NothingToSay(_) => "nothing_to_say",
            RejectionKind::UnknownVoice { .. } => "unknown_voice",
            RejectionKind::Conflict { .. } => "conflict",
            RejectionKind::DeliveryLimit { .. } => "delivery_limit",
        }
    }
}

/// Parses and validates one message body (the voice is a well-formed name here; whether the model
/// has it is the worker's `VoiceBook`'s to say). Whether `job_id` is required: on the wire yes; `enqueue`
/// passes `require_id = false` and generates one.
pub fn parse_job(body: &[u8], limits: &Limits, require_id: bool) -> Result<Job, Rejection> {
    let reject = |job_id, kind| Rejection { job_id, campaign: None, kind };
    if body.len() > limits.max_message_bytes {
        return Err(reject(None, RejectionKind::TooLarge { bytes: body.len(), limit: limits.max_message_bytes }));
    }
    let text = std::str::from_utf8(body).map_err(|e| reject(None, RejectionKind::NotUtf8 { at: e.valid_up_to() }))?;
    // A byte-order mark (editors on Windows write one) is not part of the JSON.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let value: Value = json::parse_refusing_duplicate_keys(text).map_err(|e| reject(None, RejectionKind::NotJson(e.to_string())))?;
    let Value::Object(mut obj) = value else {
        return Err(reject(None, RejectionKind::NotObject));
    };
    // The campaign first: a job refused for anything else is still filed under the campaign it names.
    let campaign = optional_name(&mut obj, "campaign", DEFAULT_CAMPAIGN);
    let named = campaign.as_ref().ok().cloned();
    let reject = |job_id, kind| Rejection { job_id, campaign: named.clone(), kind };

    let job_id = match obj.remove("job_id") {
        None | Some(Value::Null) if !require_id => Uuid::new_v4(),
        None | Some(Value::Null) => return Err(reject(None, RejectionKind::MissingJobId)),
        Some(Value::String(s)) => {
            Uuid::parse_str(s.trim()).map_err(|_| reject(None, RejectionKind::InvalidJobId(truncate(&s, 64))))?
        }
        Some(other) => return Err(reject(None, RejectionKind::InvalidJobId(truncate(&other.to_string(), 64)))),
    };
    let id = Some(job_id);

    let speech_tokens = match obj.remove("speech_tokens") {
        None | Some(Value::Null) => None,
        Some(v) => Some(speech_tokens(v, limits.max_speech_tokens).map_err(|k| reject(id, k))?),
    };
    let text = match obj.remove("text") {
        None | Some(Value::Null) if speech_tokens.is_some() => String::new(),
        None | Some(Value::Null) => return Err(reject(id, RejectionKind::MissingText)),
        Some(Value::String(s)) => s,
        Some(_) => return Err(reject(id, RejectionKind::TextNotString)),
    };
    if is_blank(&text) && speech_tokens.is_none() {
        return Err(reject(id, RejectionKind::EmptyText));
    }
    if let Some(at) = text.chars().position(|c| c == '\0') {
        return Err(reject(id, RejectionKind::NulInText { at }));
    }
    let chars = text.chars().count();
    if chars > limits.max_text_chars {
        return Err(reject(id, RejectionKind::TextTooLong { chars, limit: limits.max_text_chars }));
    }

    let voice = optional_name(&mut obj, "voice", DEFAULT_VOICE).map_err(|k| reject(id, k))?;
    let campaign = campaign.map_err(|k| reject(id, k))?;

    let priority = match obj.remove("priority") {
        None | Some(Value::Null) => 0,
        // 5 and 5.0 are the same number in JSON; 5.5 is not a priority.
        Some(Value::Number(n)) => match n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= 9.0).map(|f| f as u64)) {
            Some(p) if p <= 9 => p as u8,
            _ => {
                return Err(reject(id, RejectionKind::InvalidField { field: "priority", reason: format!("{n} is not an integer 0-9") }))
            }
        },
        Some(_) => {
            return Err(reject(id, RejectionKind::InvalidField { field: "priority", reason: "must be an integer 0-9".into() }))
        }
    };
    let metadata = match obj.remove("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => {
            if contains_nul(&Value::Object(m.clone())) {
                return Err(reject(id, RejectionKind::InvalidField { field: "metadata", reason: "contains a NUL character".into() }));
            }
            Some(m)
        }
        Some(_) => return Err(reject(id, RejectionKind::InvalidField { field: "metadata", reason: "must be a JSON object".into() })),
    };
    let (mode, instruction) = mode_and_instruction(&mut obj).map_err(|k| reject(id, k))?;
    let format = match obj.remove("format") {
        None | Some(Value::Null) => None,
        Some(Value::String(f)) => {
            Some(f.parse().map_err(|reason: String| reject(id, RejectionKind::InvalidField { field: "format", reason }))?)
        }
        Some(_) => return Err(reject(id, RejectionKind::InvalidField { field: "format", reason: format!("must be a string: {}", crate::audio::OutputFormat::NAMES) })),
    };
    let speed = match obj.remove("speed") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(v) if (MIN_SPEED..=MAX_SPEED).contains(&v) => Some(v),
            _ => return Err(reject(id, RejectionKind::InvalidField { field: "speed", reason: format!("{n} is outside {MIN_SPEED}-{MAX_SPEED}") })),
        },
        Some(_) => return Err(reject(id, RejectionKind::InvalidField { field: "speed", reason: format!("must be a number {MIN_SPEED}-{MAX_SPEED}") })),
    };
    // Unknown fields are ignored (forward compatibility), except those later issues reserve.
    Ok(Job { job_id, text, speech_tokens, voice, campaign, priority, metadata, mode, instruction, format, speed })
}

/// `mode` (`zero_shot`, `cross_lingual`, `instruct`) and `instruction` (required by, and only
/// read in, mode `instruct`).
fn mode_and_instruction(obj: &mut Map<String, Value>) -> Result<(Option<Mode>, Option<String>), RejectionKind> {
    let invalid = |field, reason: &str| RejectionKind::InvalidField { field, reason: reason.to_string() };
    let mode = match obj.remove("mode") {
        None | Some(Value::Null) => None,
        Some(v) => Some(serde_json::from_value::<Mode>(v).map_err(|_| invalid("mode", "must be \"zero_shot\", \"cross_lingual\" or \"instruct\""))?),
    };
    let instruction = match obj.remove("instruction") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if is_blank(&s) => return Err(invalid("instruction", "is empty")),
        Some(Value::String(s)) if s.contains('\0') => return Err(invalid("instruction", "contains a NUL character")),
        Some(Value::String(s)) if s.chars().count() > MAX_INSTRUCTION_CHARS => {
            return Err(invalid("instruction", &format!("has more than {MAX_INSTRUCTION_CHARS} characters")))
        }
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err(invalid("instruction", "must be a string")),
    };
    match (mode, &instruction) {
        (Some(Mode::Instruct), None) => Err(invalid("instruction", "mode instruct needs an instruction")),
        (Some(Mode::ZeroShot | Mode::CrossLingual), Some(_)) => Err(invalid("instruction", "is read only in mode instruct")),
        // An instruction alone asks for mode instruct.
        (None, Some(_)) => Ok((Some(Mode::Instruct), instruction)),
        _ => Ok((mode, instruction)),
    }
}

/// Whether `text` has nothing to speak: only whitespace (Unicode White_Space, e.g. U+0085),
/// control characters, or invisible format characters (zero-width space U+200B, joiners,
/// U+2060, the BOM U+FEFF, the soft hyphen). The one rule for "empty", in code and schema.
pub fn is_blank(text: &str) -> bool {
    text.chars().all(|c| {
        c.is_whitespace() || c.is_control() || matches!(c, '\u{200b}'..='\u{200d}' | '\u{2060}' | '\u{feff}' | '\u{180e}' | '\u{00ad}')
    })
}

/// `speech_tokens`: a non-empty array of at most `limit` integers in 0..2³¹.
fn speech_tokens(v: Value, limit: usize) -> Result<Vec<i64>, RejectionKind> {
    let bad = |reason: String| RejectionKind::InvalidSpeechTokens(reason);
    let Value::Array(items) = v else {
        return Err(bad("must be an array of integers".into()));
    };
    if items.is_empty() {
        return Err(bad("is empty".into()));
    }
    if items.len() > limit {
        return Err(bad(format!("has {} tokens, over the limit of {limit}", items.len())));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_i64()
                .filter(|t| (0..=i64::from(i32::MAX)).contains(t))
                .ok_or_else(|| bad(format!("item {i} ({}) is not an integer 0-2147483647", truncate(&t.to_string(), 32))))
        })
        .collect()
}

/// `voice` and `campaign`: optional strings of letters, digits, `.`, `_`, `-` (they appear in
/// object keys and reports).
fn optional_name(obj: &mut Map<String, Value>, field: &'static str, default: &str) -> Result<String, RejectionKind> {
    match obj.remove(field) {
        None | Some(Value::Null) => Ok(default.to_string()),
        Some(Value::String(s)) => match check_name(&s) {
            Ok(()) => Ok(s),
            Err(reason) => Err(RejectionKind::InvalidField { field, reason }),
        },
        Some(_) => Err(RejectionKind::InvalidField { field, reason: "must be a string".into() }),
    }
}

/// The rule for voice and campaign names: 1-128 of A-Z a-z 0-9 . _ - (not starting with `.`);
/// `Err` says so. `voice add` checks a new voice's name with it, so every voice can be asked for.
pub fn check_name(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !s.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(format!("`{}` must be 1-{MAX_NAME_LEN} of A-Z a-z 0-9 . _ - (not starting with .)", truncate(s, 64)))
    }
}

fn contains_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(contains_nul),
        Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

/// `s` with its control characters escaped (`\u{1b}`, `\n`): safe in a text log line or on a
/// terminal.
pub fn escape_controls(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect()
}

/// At most `n` characters of `s`, for error messages, with control characters escaped (a
/// message's text must not reach a terminal or a text log raw: no ESC sequences, no forged lines).
pub fn truncate(s: &str, n: usize) -> String {
    let mut t = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == n {
            t.push('…');
            break;
        }
        if c.is_control() {
            t.extend(c.escape_default());
        } else {
            t.push(c);
        }
    }
    t
}

#[cfg(test)]
mod tests;
