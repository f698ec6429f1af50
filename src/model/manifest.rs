//! `model.toml`: what a model directory holds and how to feed it.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ModelError;

/// The kinds of model voxbatch can load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub enum ModelKind {
    /// `model.pt`: a TorchScript module `forward(tokens[B,T] i64, lengths[B] i64, speakers[B] i64)
    /// -> (audio[B,S] f32, audio_lengths[B] i64)`.
    #[serde(rename = "torchscript")]
    TorchScript,
    /// CosyVoice2's token2wav (flow matching + HiFT) in tch: `token2wav.safetensors` and
    /// `voices.safetensors`, written by `tools/convert_cosyvoice.py`. Jobs carry speech tokens.
    #[serde(rename = "cosyvoice2-token2wav")]
    Cosyvoice2Token2Wav,
    /// CosyVoice2 whole: the token2wav files plus the speech-token LM (`llm.safetensors`,
    /// `[cosyvoice2.llm]`), the text tokenizer (`tokenizer.json`) and the normalisation grammars
    /// (`fsts/`). Jobs carry text (or, as for `cosyvoice2-token2wav`, speech tokens).
    #[serde(rename = "cosyvoice2")]
    Cosyvoice2,
    /// CosyVoice3's token2wav (DiT flow matching + causal HiFT) in tch: `token2wav.safetensors`
    /// and `voices.safetensors`, written by `tools/convert_cosyvoice.py` from an official
    /// CosyVoice3 directory. Jobs carry speech tokens.
    #[serde(rename = "cosyvoice3-token2wav")]
    Cosyvoice3Token2Wav,
    /// CosyVoice3 whole: the token2wav files plus its speech-token LM (`llm.safetensors`,
    /// `[cosyvoice3.llm]`), the text tokenizer with CosyVoice3's added tokens (`tokenizer.json`)
    /// and the normalisation grammars (`fsts/`). Jobs carry text (or speech tokens), as for
    /// `cosyvoice2`.
    #[serde(rename = "cosyvoice3")]
    Cosyvoice3,
}

impl ModelKind {
    /// The kind as `model.toml` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::TorchScript => "torchscript",
            ModelKind::Cosyvoice2Token2Wav => "cosyvoice2-token2wav",
            ModelKind::Cosyvoice2 => "cosyvoice2",
            ModelKind::Cosyvoice3Token2Wav => "cosyvoice3-token2wav",
            ModelKind::Cosyvoice3 => "cosyvoice3",
        }
    }

    /// Whether the kind's voices are CosyVoice voices (an x-vector and a flow prompt, kept in
    /// Postgres's `voices` per model, the directory's own imported there), as opposed to speaker
    /// indices fixed by the directory. Such models also take a job's `speed`.
    pub fn has_prompt_voices(self) -> bool {
        matches!(self, ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice2 | ModelKind::Cosyvoice3Token2Wav | ModelKind::Cosyvoice3)
    }

    /// Whether jobs of this kind carry text (the frontend, the LLM and token2wav: `model::tts`),
    /// or speech tokens only.
    pub fn takes_text(self) -> bool {
        matches!(self, ModelKind::Cosyvoice2 | ModelKind::Cosyvoice3)
    }
}

/// How text becomes token ids.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum TokenizerSpec {
    /// One token per Unicode scalar value: id = 1 + (codepoint mod (vocab_size − 1)); 0 is padding.
    #[serde(rename = "codepoint")]
    Codepoint { vocab_size: u32 },
    /// The job carries `speech_tokens` (ids 0..vocab_size, from CosyVoice2's LLM or tokenizer);
    /// its text is not tokenized.
    #[serde(rename = "speech_tokens")]
    SpeechTokens { vocab_size: u32 },
}

/// `[cosyvoice2]`: the dimensions of a `cosyvoice2-token2wav` model (`full` or `tiny`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cosyvoice2Dims {
    pub vocab_size: i64,
    pub encoder_heads: i64,
    pub encoder_units: i64,
    pub encoder_blocks: usize,
    pub encoder_up_blocks: usize,
    pub decoder_channels: i64,
    pub decoder_blocks: usize,
    pub decoder_mid_blocks: usize,
    pub decoder_heads: i64,
    pub decoder_head_dim: i64,
    pub hift_channels: i64,
    pub f0_channels: i64,
    /// Euler steps of the flow matching (CosyVoice2: 10).
    pub flow_steps: usize,
    /// Classifier-free guidance rate (CosyVoice2: 0.7).
    pub cfg_rate: f64,
    /// The HiFT vocoder's precision, whatever the flow's: `tf32` (the default, as the official
    /// code runs it: outside autocast, under torch's defaults, where cuDNN convolutions use TF32),
    /// `fp32` (true fp32, TF32 off), `bf16` or `fp16` (autocast). On a CPU `tf32` is fp32. Its
    /// STFT/iSTFT are fp32 whatever this says.
    #[serde(default)]
    pub vocoder_precision: Option<super::Precision>,
    /// Before `vocoder_precision`: `true` = `fp32`; `false` (or absent) now means the default, `tf32`.
    #[serde(default)]
    pub vocoder_fp32: bool,
    /// How the eager flow estimator attends: `padded` (the default), `packed` or `flash`
    /// (experimental; see [`super::cosyvoice2::estimator::FlowAttention`]). Compiled packages are not affected.
    #[serde(default)]
    pub flow_attention: super::cosyvoice2::estimator::FlowAttention,
    /// The speech-token LM (`llm.safetensors`), when the model has one.
    #[serde(default)]
    pub llm: Option<LlmDims>,
}

impl Cosyvoice2Dims {
    /// The vocoder's precision (`vocoder_precision`, else the older `vocoder_fp32`, else `tf32`).
    pub fn vocoder(&self) -> super::Precision {
        self.vocoder_precision.unwrap_or(if self.vocoder_fp32 { super::Precision::Fp32 } else { super::Precision::Tf32 })
    }
}

/// `[cosyvoice3]`: the dimensions of a `cosyvoice3-token2wav` model, as `tools/convert_cosyvoice.py`
/// reads them from `cosyvoice3.yaml` (checked against the weights).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cosyvoice3Dims {
    pub vocab_size: i64,
    /// Tokens the pre-lookahead layer looks ahead (3).
    pub pre_lookahead_len: i64,
    pub pre_lookahead_channels: i64,
    pub dit_dim: i64,
    pub dit_depth: usize,
    pub dit_heads: i64,
    pub dit_head_dim: i64,
    pub dit_ff_mult: i64,
    pub hift_channels: i64,
    pub f0_channels: i64,
    /// Mel frames the vocoder's `conv_pre` looks ahead (4).
    pub conv_pre_look_right: i64,
    /// Euler steps of the flow matching (10).
    pub flow_steps: usize,
    /// Classifier-free guidance rate (0.7).
    pub cfg_rate: f64,
    /// Rows of the source's fixed noise (`hift.m_source.l_sin_gen.sine_waves`): the longest item
    /// the vocoder takes is `noise_samples / 480` frames.
    pub noise_samples: i64,
    /// The vocoder's precision; absent, the flow's, as upstream runs CosyVoice3's vocoder inside
    /// the flow's autocast (its F0 predictor in float64 whatever this says).
    #[serde(default)]
    pub vocoder_precision: Option<super::Precision>,
    /// The speech-token LM (`llm.safetensors`, kind `cosyvoice3`).
    #[serde(default)]
    pub llm: Option<LlmDims>,
}

impl Cosyvoice3Dims {
    /// The vocoder's precision when the flow runs at `flow` (`vocoder_precision`, else `flow`).
    pub fn vocoder(&self, flow: super::Precision) -> super::Precision {
        self.vocoder_precision.unwrap_or(flow)
    }

    /// What the dimensions must satisfy for the port to run them; `Err` says which does not.
    fn check(&self) -> Result<(), String> {
        let checks = [
            (self.dit_dim > 0 && self.dit_dim % 16 == 0, "dit_dim must be a positive multiple of 16 (the position embedding's 16 groups)"),
            (self.dit_head_dim > 0 && self.dit_head_dim % 2 == 0, "dit_head_dim must be even (rotary pairs)"),
            (self.dit_heads > 0 && self.dit_depth > 0 && self.dit_ff_mult > 0, "dit_heads, dit_depth and dit_ff_mult must be > 0"),
            (self.hift_channels >= 8 && self.hift_channels % 8 == 0, "hift_channels must be a multiple of 8 (three halvings)"),
            (self.flow_steps > 0 && self.noise_samples >= 480, "flow_steps must be > 0 and noise_samples at least one frame (480)"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err(format!("[cosyvoice3]: {why}")),
            None => Ok(()),
        }
    }
}

/// `[cosyvoice2.llm]` or `[cosyvoice3.llm]`: the speech-token LM's Qwen2 dimensions, sampling and
/// length ratios (tools/convert_cosyvoice.py writes them from `CosyVoice-BlankEN/config.json` and
/// the model's yaml); the last three are CosyVoice3's.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmDims {
    pub layers: usize,
    pub hidden: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub intermediate: i64,
    pub vocab: i64,
    pub rope_theta: f64,
    pub eps: f64,
    /// 6561: the end-of-speech id; the LM's outputs are speech_tokens + 3.
    pub speech_tokens: i64,
    pub top_p: f64,
    pub top_k: i64,
    pub win_size: usize,
    pub tau_r: f64,
    pub min_token_text_ratio: f64,
    pub max_token_text_ratio: f64,
    /// The tokenizer's id of `<|endofprompt|>`, which CosyVoice3's LM input must hold (151646 in
    /// the released model).
    #[serde(default)]
    pub end_of_prompt: Option<i64>,
    /// CosyVoice3's "silent" speech tokens: at most `max_silent_tokens` of them in a row are kept
    /// in the output (`CosyVoice3Model.llm_job`); empty: none dropped.
    #[serde(default)]
    pub silent_tokens: Vec<i64>,
    #[serde(default)]
    pub max_silent_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

/// A model directory's manifest.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    pub kind: ModelKind,
    #[serde(default)]
    pub description: String,
    pub sample_rate: u32,
    /// Output frames per input token (the length regulator's factor).
    pub frames_per_token: u32,
    /// Waveform samples per frame (the vocoder's total upsampling).
    pub samples_per_frame: u32,
    /// Voice names; a job's `voice` must be one of these. Empty only for a CosyVoice2 model whose
    /// checkpoint had no voices.
    pub voices: Vec<String>,
    pub tokenizer: TokenizerSpec,
    pub signature: Signature,
    #[serde(default)]
    pub cosyvoice2: Option<Cosyvoice2Dims>,
    #[serde(default)]
    pub cosyvoice3: Option<Cosyvoice3Dims>,
    /// Tokens each voice's prompt adds to a job (CosyVoice2 zero-shot voices), in `voices` order;
    /// empty when no voice has a prompt. The batch policy sizes a job by its tokens plus these.
    #[serde(default)]
    pub voice_prompt_tokens: Vec<u32>,
    #[serde(skip)]
    pub dir: PathBuf,
}

/// The files a converted CosyVoice directory must hold: token2wav's weights and voices, and for a
/// whole model (`text`) its LM, tokenizer and normalisation grammars.
fn cosyvoice_files(dir: &Path, text: bool) -> Result<(), String> {
    let mut files = vec![super::token2wav::WEIGHTS_FILE, super::token2wav::VOICES_FILE];
    if text {
        files.extend([super::llm::speech_lm::LLM_FILE, crate::frontend::tokenizer::TOKENIZER_FILE]);
        let fsts = crate::frontend::normalize::FST_DIR;
        if !dir.join(fsts).is_dir() {
            return Err(format!("{fsts}/ (the normalisation grammars) is missing (tools/convert_cosyvoice.py copies it)"));
        }
    }
    match files.into_iter().find(|f| !dir.join(f).is_file()) {
        Some(f) => Err(format!("{f} is missing (tools/convert_cosyvoice.py writes it)")),
        None => Ok(()),
    }
}

const TORCHSCRIPT_INPUTS: [&str; 3] = ["tokens:int64[B,T]", "lengths:int64[B]", "speakers:int64[B]"];
const TORCHSCRIPT_OUTPUTS: [&str; 2] = ["audio:float32[B,S]", "audio_lengths:int64[B]"];
const TOKEN2WAV_INPUTS: [&str; 1] = ["speech_tokens:int64[B,T]"];
const TOKEN2WAV_OUTPUTS: [&str; 1] = ["audio:float32[B,S]"];

impl Manifest {
    /// Reads and checks `dir/model.toml` and that the weights it needs exist.
    pub fn load(dir: &Path) -> Result<Manifest, ModelError> {
        let err = |reason: String| ModelError::Manifest { dir: dir.display().to_string(), reason };
        let path = dir.join("model.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            err(format!(
                "cannot read model.toml ({e}); a model directory holds model.toml and its weights \
                 (make models, or tools/export_reference_model.py, writes the reference model)"
            ))
        })?;
        let mut m: Manifest = toml::from_str(&text).map_err(|e| err(format!("model.toml is invalid: {e}")))?;
        m.dir = dir.to_path_buf();
        if m.sample_rate == 0 || m.frames_per_token == 0 || m.samples_per_frame == 0 {
            return Err(err("sample_rate, frames_per_token and samples_per_frame must be > 0".into()));
        }
        // A converted CosyVoice2 model may have no voices yet (its spk2info.pt had none): it loads,
        // and its jobs are refused with that reason until a voice is added.
        if m.voices.is_empty() && m.kind == ModelKind::TorchScript {
            return Err(err("`voices` must name at least one voice".into()));
        }
        if !m.voice_prompt_tokens.is_empty() && m.voice_prompt_tokens.len() != m.voices.len() {
            return Err(err(format!("voice_prompt_tokens has {} entries for {} voices", m.voice_prompt_tokens.len(), m.voices.len())));
        }
        if m.vocab_size() < 2 {
            return Err(err("tokenizer.vocab_size must be >= 2".into()));
        }
        match m.kind {
            ModelKind::TorchScript => {
                if m.signature.inputs != TORCHSCRIPT_INPUTS || m.signature.outputs != TORCHSCRIPT_OUTPUTS {
                    return Err(err(format!(
                        "kind torchscript needs signature inputs {TORCHSCRIPT_INPUTS:?} and outputs {TORCHSCRIPT_OUTPUTS:?}"
                    )));
                }
                if !dir.join("model.pt").is_file() {
                    return Err(err("model.pt is missing".into()));
                }
            }
            ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice2 => {
                if m.signature.inputs != TOKEN2WAV_INPUTS || m.signature.outputs != TOKEN2WAV_OUTPUTS {
                    return Err(err(format!(
                        "kind cosyvoice2-token2wav needs signature inputs {TOKEN2WAV_INPUTS:?} and outputs {TOKEN2WAV_OUTPUTS:?}"
                    )));
                }
                let Some(dims) = &m.cosyvoice2 else {
                    return Err(err("kind cosyvoice2-token2wav needs a [cosyvoice2] section (tools/convert_cosyvoice.py writes it)".into()));
                };
                if !matches!(m.tokenizer, TokenizerSpec::SpeechTokens { .. }) || dims.vocab_size != m.vocab_size() {
                    return Err(err("kind cosyvoice2-token2wav needs tokenizer kind speech_tokens with the flow's vocab_size".into()));
                }
                if (m.sample_rate, m.frames_per_token, m.samples_per_frame) != (24000, 2, 480) {
                    return Err(err("CosyVoice2 token2wav is 24000 Hz, 2 frames per token, 480 samples per frame".into()));
                }
                let whole = m.kind == ModelKind::Cosyvoice2;
                if whole && dims.llm.is_none() {
                    return Err(err("kind cosyvoice2 needs a [cosyvoice2.llm] section (convert a directory with llm.pt)".into()));
                }
                cosyvoice_files(dir, whole).map_err(&err)?;
            }
            ModelKind::Cosyvoice3Token2Wav | ModelKind::Cosyvoice3 => {
                if m.signature.inputs != TOKEN2WAV_INPUTS || m.signature.outputs != TOKEN2WAV_OUTPUTS {
                    return Err(err(format!(
                        "kind cosyvoice3-token2wav needs signature inputs {TOKEN2WAV_INPUTS:?} and outputs {TOKEN2WAV_OUTPUTS:?}"
                    )));
                }
                let Some(dims) = &m.cosyvoice3 else {
                    return Err(err("kind cosyvoice3-token2wav needs a [cosyvoice3] section (tools/convert_cosyvoice.py writes it)".into()));
                };
                dims.check().map_err(&err)?;
                if !matches!(m.tokenizer, TokenizerSpec::SpeechTokens { .. }) || dims.vocab_size != m.vocab_size() {
                    return Err(err("kind cosyvoice3-token2wav needs tokenizer kind speech_tokens with the flow's vocab_size".into()));
                }
                if (m.sample_rate, m.frames_per_token, m.samples_per_frame) != (24000, 2, 480) {
                    return Err(err("CosyVoice3 token2wav is 24000 Hz, 2 frames per token, 480 samples per frame".into()));
                }
                let whole = m.kind == ModelKind::Cosyvoice3;
                if whole {
                    let Some(llm) = &dims.llm else {
                        return Err(err("kind cosyvoice3 needs a [cosyvoice3.llm] section (convert a directory with llm.pt)".into()));
                    };
                    if llm.end_of_prompt.is_none() {
                        return Err(err("[cosyvoice3.llm] needs end_of_prompt (the tokenizer's id of <|endofprompt|>)".into()));
                    }
                }
                cosyvoice_files(dir, whole).map_err(&err)?;
            }
        }
        Ok(m)
    }

    /// The speech-token LM this model has, and whose layout it follows (`[cosyvoice2.llm]` or
    /// `[cosyvoice3.llm]`).
    pub fn llm(&self) -> Option<(super::llm::speech_lm::LmFamily, &LlmDims)> {
        use super::llm::speech_lm::LmFamily;
        match (&self.cosyvoice2, &self.cosyvoice3) {
            (Some(d), _) => d.llm.as_ref().map(|l| (LmFamily::Cosyvoice2, l)),
            (None, Some(d)) => d.llm.as_ref().map(|l| (LmFamily::Cosyvoice3, l)),
            (None, None) => None,
        }
    }

    /// Bytes of the weights on disk.
    pub fn weights_bytes(&self) -> u64 {
        let file = match self.kind {
            ModelKind::TorchScript => "model.pt",
            ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice2 | ModelKind::Cosyvoice3Token2Wav | ModelKind::Cosyvoice3 => super::token2wav::WEIGHTS_FILE,
        };
        std::fs::metadata(self.dir.join(file)).map(|m| m.len()).unwrap_or(0)
    }

    /// The vocoder's precision when the flow runs at `flow`: CosyVoice2's `vocoder_precision`
    /// (whatever the flow's), CosyVoice3's (the flow's by default), else `flow`.
    pub fn vocoder_precision(&self, flow: super::Precision) -> super::Precision {
        match (&self.cosyvoice2, &self.cosyvoice3) {
            (Some(d), _) => d.vocoder(),
            (None, Some(d)) => d.vocoder(flow),
            (None, None) => flow,
        }
    }

    /// Bytes the model's eager attention may hold per item per (mel frame)², beyond what the
    /// built-in memory model's linear term charges (`batch::memory::Profile::with_quadratic`):
    /// CosyVoice3's DiT attends over all of an item's frames in every block, on the doubled (CFG)
    /// batch — scores, their masked and softmaxed copies in fp32 per head, and the mask's bias:
    /// `2 · (3 · heads + 1) · 4`. Zero for the others (CosyVoice2's sizing is unchanged).
    pub fn attention_bytes_per_frame_squared(&self) -> f64 {
        self.cosyvoice3.as_ref().map_or(0.0, |d| 2.0 * (3.0 * d.dit_heads as f64 + 1.0) * 4.0)
    }

    /// Size of the token vocabulary (ids are 1..vocab_size; 0 pads).
    pub fn vocab_size(&self) -> i64 {
        match self.tokenizer {
            TokenizerSpec::Codepoint { vocab_size } | TokenizerSpec::SpeechTokens { vocab_size } => i64::from(vocab_size),
        }
    }

    /// Whether jobs for this model must carry `speech_tokens` (rather than text to tokenize).
    pub fn takes_speech_tokens(&self) -> bool {
        matches!(self.tokenizer, TokenizerSpec::SpeechTokens { .. })
    }

    /// Token ids of `text` (empty for a model that takes speech tokens).
    pub fn tokenize(&self, text: &str) -> Vec<i64> {
        match self.tokenizer {
            TokenizerSpec::Codepoint { vocab_size } => {
                let modulus = i64::from(vocab_size) - 1;
                text.chars().map(|c| 1 + i64::from(u32::from(c)) % modulus).collect()
            }
            TokenizerSpec::SpeechTokens { .. } => Vec::new(),
        }
    }

    /// Index of `voice` in [`Manifest::voices`].
    pub fn voice_index(&self, voice: &str) -> Option<i64> {
        self.voices.iter().position(|v| v == voice).map(|i| i as i64)
    }

    /// Tokens the prompt of voice `index` adds to every job (0 without a prompt).
    pub fn prompt_tokens(&self, index: i64) -> usize {
        usize::try_from(index).ok().and_then(|i| self.voice_prompt_tokens.get(i)).map_or(0, |&n| n as usize)
    }

    /// Output samples for an input of `tokens` tokens.
    pub fn predicted_samples(&self, tokens: usize) -> u64 {
        tokens as u64 * u64::from(self.frames_per_token) * u64::from(self.samples_per_frame)
    }

    /// Output seconds for an input of `tokens` tokens.
    pub fn predicted_seconds(&self, tokens: usize) -> f64 {
        self.predicted_samples(tokens) as f64 / f64::from(self.sample_rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "m"
kind = "torchscript"
sample_rate = 24000
frames_per_token = 6
samples_per_frame = 240
voices = ["default"]
[tokenizer]
kind = "codepoint"
vocab_size = 4096
[signature]
inputs = ["tokens:int64[B,T]", "lengths:int64[B]", "speakers:int64[B]"]
outputs = ["audio:float32[B,S]", "audio_lengths:int64[B]"]
"#;

    #[test]
    fn a_valid_manifest_loads_and_tokenizes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.toml"), GOOD).unwrap();
        std::fs::write(dir.path().join("model.pt"), b"x").unwrap();
        let m = Manifest::load(dir.path()).unwrap();
        assert_eq!(m.tokenize("a你"), vec![1 + 97, 1 + (0x4f60 % 4095)]);
        assert_eq!(m.predicted_samples(2), 2 * 6 * 240);
        assert_eq!(m.voice_index("default"), Some(0));
        assert_eq!((m.prompt_tokens(0), m.prompt_tokens(5)), (0, 0), "no prompts declared");
    }

    #[test]
    fn a_broken_model_directory_gives_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = Manifest::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("model.toml"), "{e}");
        std::fs::write(dir.path().join("model.toml"), GOOD).unwrap();
        let e = Manifest::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("model.pt is missing"), "{e}");
        std::fs::write(dir.path().join("model.toml"), GOOD.replace("24000", "0")).unwrap();
        assert!(Manifest::load(dir.path()).is_err());
        let two = GOOD.replace(r#"voices = ["default"]"#, "voices = [\"default\"]\nvoice_prompt_tokens = [0, 6]");
        std::fs::write(dir.path().join("model.toml"), two).unwrap();
        let e = Manifest::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("voice_prompt_tokens has 2 entries for 1 voices"), "{e}");
        std::fs::write(dir.path().join("model.toml"), GOOD.replace("speakers", "spk")).unwrap();
        let e = Manifest::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("signature"), "{e}");
    }
}
