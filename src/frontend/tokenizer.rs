//! CosyVoice2's text tokenizer: the Qwen2 byte-level BPE of the checkpoint's `CosyVoice-BlankEN`
//! plus CosyVoice2's added special tokens (`<|endofprompt|>`, `[breath]`, `[laughter]`, …), as
//! `cosyvoice/tokenizer/tokenizer.py` (`QwenTokenizer`) builds it. `tools/convert_cosyvoice.py`
//! writes it as one `tokenizer.json` in the model directory; this reads it with the `tokenizers`
//! crate (Hugging Face's own implementation), so ids equal the reference's.
//!
//! Neighbours: `frontend` tokenizes segments with it; `segment` counts tokens with it.

use std::path::Path;

/// The converted tokenizer's file in a model directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// The added token that closes a prompt (CosyVoice2's instructions; CosyVoice3's system prompt,
/// which its LM input must hold).
pub const END_OF_PROMPT: &str = "<|endofprompt|>";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    #[error("cannot load {path}: {reason} (tools/convert_cosyvoice.py writes it from CosyVoice-BlankEN)")]
    Load { path: String, reason: String },
    #[error("cannot tokenize the text: {0}")]
    Encode(String),
}

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
}

impl TextTokenizer {
    pub fn load(path: &Path) -> Result<TextTokenizer, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Load { path: path.display().to_string(), reason: e.to_string() })?;
        Ok(TextTokenizer { inner })
    }

    /// Token ids of `text`, special tokens written in the text (`[breath]`) included as theirs.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, TokenizerError> {
        let enc = self.inner.encode(text, true).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    /// Tokens of `text` (0 when it cannot be tokenized, which a later `encode` reports).
    pub fn count(&self, text: &str) -> usize {
        self.inner.encode(text, true).map(|e| e.len()).unwrap_or(0)
    }

    /// Ids the tokenizer knows (base vocabulary and added tokens).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
