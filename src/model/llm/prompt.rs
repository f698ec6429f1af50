//! What the LLM is given for a job's segments, per mode (`cosyvoice/cli/frontend.py`): zero-shot —
//! the voice's prompt text and prompt speech tokens (`frontend_zero_shot`); cross-lingual —
//! neither (`frontend_cross_lingual`); instruct — the instruction followed by `<|endofprompt|>` as
//! the prompt text, no prompt speech tokens (`frontend_instruct2`). Every segment samples from its
//! own stream, seeded by job id and segment index, so a retried job samples the same tokens.
//!
//! CosyVoice3's LM is trained with a system prompt before `<|endofprompt|>` (its input must hold
//! that token: [`SystemPrompt`]), written as the reference's example writes it: zero-shot prompt
//! text `"You are a helpful assistant.<|endofprompt|>" + transcript`, cross-lingual the same
//! prefix before each segment's text (where it counts in the length limits, as the reference's
//! `text_len` counts it), instruct `"You are a helpful assistant. " + instruction +
//! "<|endofprompt|>"` ([`instruction_text`]). A prompt text or segment that holds
//! `<|endofprompt|>` already is left as it is.
//!
//! Neighbours: `frontend` makes the segments' token ids (and the instruction's); `speech_lm`
//! decodes the requests; `job::Mode` is the job's choice.

use super::sampler::sequence_seed;
use super::request::LmRequest;
use super::family::LmFamily;
use crate::job::Mode;
use crate::model::token2wav::Voice;

pub use crate::frontend::tokenizer::END_OF_PROMPT;

/// CosyVoice3's system prompt, as the reference's example gives it.
pub const SYSTEM_PROMPT: &str = "You are a helpful assistant.";

/// An instruction (mode instruct) as `family`'s LM is given it, before tokenizing:
/// CosyVoice2's `"<instruction><|endofprompt|>"`, CosyVoice3's `"You are a helpful assistant.
/// <instruction><|endofprompt|>"`. A closing `<|endofprompt|>` the job wrote itself (the
/// reference's examples do) is not doubled, nor CosyVoice3's system prompt.
pub fn instruction_text(family: LmFamily, instruction: &str) -> String {
    let i = instruction.trim();
    let i = i.strip_suffix(END_OF_PROMPT).unwrap_or(i).trim_end();
    match family {
        LmFamily::Cosyvoice2 => format!("{i}{END_OF_PROMPT}"),
        LmFamily::Cosyvoice3 => {
            let i = i.strip_prefix(SYSTEM_PROMPT).unwrap_or(i).trim_start();
            format!("{SYSTEM_PROMPT} {i}{END_OF_PROMPT}")
        }
    }
}

/// CosyVoice3's system prompt as token ids: `"You are a helpful assistant.<|endofprompt|>"`,
/// put before a zero-shot voice's prompt text and a cross-lingual segment's text that do not
/// hold `<|endofprompt|>` already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemPrompt {
    /// The tokens of [`SYSTEM_PROMPT`] followed by [`END_OF_PROMPT`].
    pub tokens: Vec<i64>,
    /// The id of [`END_OF_PROMPT`].
    pub end_of_prompt: i64,
}

impl SystemPrompt {
    /// `text` behind the system prompt, unless it holds `<|endofprompt|>` already.
    fn before(&self, text: &[i64]) -> Vec<i64> {
        if text.contains(&self.end_of_prompt) {
            text.to_vec()
        } else {
            [self.tokens.as_slice(), text].concat()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PromptError {
    #[error("mode zero_shot needs a voice with a prompt (prompt text and speech tokens); voice `{0}` has none: use cross_lingual or instruct")]
    NoPrompt(String),
    #[error("mode instruct needs an instruction")]
    NoInstruction,
}

/// The mode a job gets when it names none: zero-shot for a voice with a prompt, else cross-lingual.
pub fn default_mode(voice: &Voice) -> Mode {
    if has_prompt(voice) {
        Mode::ZeroShot
    } else {
        Mode::CrossLingual
    }
}

fn has_prompt(voice: &Voice) -> bool {
    !voice.prompt_text.is_empty() && !voice.llm_prompt_tokens.is_empty()
}

/// One request per segment (`segments[i]`: its text token ids). `instruction`: the token ids of
/// the job's [`instruction_text`] (mode instruct only). `system`: CosyVoice3's system prompt
/// (`None` for CosyVoice2).
pub fn requests(
    job_id: uuid::Uuid,
    segments: &[Vec<i64>],
    voice_name: &str,
    voice: &Voice,
    mode: Option<Mode>,
    instruction: Option<&[i64]>,
    system: Option<&SystemPrompt>,
) -> Result<Vec<LmRequest>, PromptError> {
    let mode = mode.unwrap_or_else(|| default_mode(voice));
    let (prompt_text, prompt_speech): (Vec<i64>, Vec<i64>) = match mode {
        Mode::ZeroShot if !has_prompt(voice) => return Err(PromptError::NoPrompt(voice_name.to_string())),
        Mode::ZeroShot => (system.map_or_else(|| voice.prompt_text.clone(), |s| s.before(&voice.prompt_text)), voice.llm_prompt_tokens.clone()),
        Mode::CrossLingual => (Vec::new(), Vec::new()),
        Mode::Instruct => (instruction.ok_or(PromptError::NoInstruction)?.to_vec(), Vec::new()),
    };
    let cross_lingual = mode == Mode::CrossLingual;
    Ok(segments
        .iter()
        .enumerate()
        .map(|(i, text)| LmRequest {
            text: match system {
                Some(s) if cross_lingual => s.before(text),
                _ => text.clone(),
            },
            prompt_text: prompt_text.clone(),
            prompt_speech: prompt_speech.clone(),
            seed: sequence_seed(job_id, i as u32),
            forced_len: None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    fn voice(prompt_text: Vec<i64>, llm_prompt_tokens: Vec<i64>) -> Voice {
        Voice {
            name: "v".into(),
            embedding: Tensor::zeros([192], (Kind::Float, tch::Device::Cpu)),
            prompt_tokens: llm_prompt_tokens.clone(),
            prompt_feat: Tensor::zeros([2 * llm_prompt_tokens.len() as i64, 80], (Kind::Float, tch::Device::Cpu)),
            llm_prompt_tokens,
            prompt_text,
        }
    }

    #[test]
    fn each_mode_gives_the_llm_what_the_reference_frontend_gives_it() {
        let job = uuid::Uuid::from_u128(7);
        let segs = vec![vec![1, 2, 3], vec![4, 5]];
        let v = voice(vec![9, 9], vec![100, 101, 102]);
        let zs = requests(job, &segs, "narrator", &v, None, None, None).unwrap();
        assert_eq!((zs[0].prompt_text.as_slice(), zs[0].prompt_speech.as_slice()), (&[9, 9][..], &[100, 101, 102][..]), "zero-shot by default");
        assert_ne!(zs[0].seed, zs[1].seed, "each segment its own stream");
        assert_eq!(zs[1].seed, requests(job, &segs, "narrator", &v, None, None, None).unwrap()[1].seed, "and the same on a retry");
        let cl = requests(job, &segs, "narrator", &v, Some(Mode::CrossLingual), None, None).unwrap();
        assert!(cl.iter().all(|r| r.prompt_text.is_empty() && r.prompt_speech.is_empty()));
        let ins = requests(job, &segs, "narrator", &v, Some(Mode::Instruct), Some(&[7, 8, 400]), None).unwrap();
        assert_eq!((ins[1].prompt_text.as_slice(), ins[1].prompt_speech.len(), ins[1].text.as_slice()), (&[7, 8, 400][..], 0, &[4, 5][..]));
        assert_eq!(requests(job, &segs, "narrator", &v, Some(Mode::Instruct), None, None).unwrap_err(), PromptError::NoInstruction);
        // A voice without a prompt: cross-lingual by default, zero-shot refused with what to do.
        let plain = voice(vec![], vec![]);
        assert_eq!(default_mode(&plain), Mode::CrossLingual);
        let e = requests(job, &segs, "plain", &plain, Some(Mode::ZeroShot), None, None).unwrap_err();
        assert!(e.to_string().contains("use cross_lingual"), "{e}");
    }

    #[test]
    fn cosyvoice3s_system_prompt_goes_before_a_zero_shot_prompt_and_each_cross_lingual_segment_once() {
        let job = uuid::Uuid::from_u128(9);
        let system = SystemPrompt { tokens: vec![50, 51, 422], end_of_prompt: 422 };
        let segs = vec![vec![1, 2, 3], vec![4, 422, 5]];
        let v = voice(vec![9, 9], vec![100, 101]);
        let zs = requests(job, &segs, "v", &v, Some(Mode::ZeroShot), None, Some(&system)).unwrap();
        assert_eq!(zs[0].prompt_text, vec![50, 51, 422, 9, 9], "the transcript behind the system prompt");
        assert_eq!(zs[0].text, vec![1, 2, 3], "the text as it is");
        let spoken = voice(vec![50, 51, 422, 9, 9], vec![100, 101]);
        let zs = requests(job, &segs, "v", &spoken, Some(Mode::ZeroShot), None, Some(&system)).unwrap();
        assert_eq!(zs[0].prompt_text, vec![50, 51, 422, 9, 9], "a prompt text with <|endofprompt|> is left as it is");
        let cl = requests(job, &segs, "v", &v, Some(Mode::CrossLingual), None, Some(&system)).unwrap();
        assert_eq!((cl[0].prompt_text.len(), cl[0].text.as_slice()), (0, &[50, 51, 422, 1, 2, 3][..]), "in the text: it counts in the length limits");
        assert_eq!(cl[1].text, vec![4, 422, 5], "a segment that holds <|endofprompt|> is left as it is");
        let ins = requests(job, &segs, "v", &v, Some(Mode::Instruct), Some(&[50, 51, 7, 422]), Some(&system)).unwrap();
        assert_eq!((ins[0].prompt_text.as_slice(), ins[0].text.as_slice()), (&[50, 51, 7, 422][..], &[1, 2, 3][..]));
    }

    #[test]
    fn an_instruction_is_written_as_each_familys_reference_writes_it() {
        assert_eq!(instruction_text(LmFamily::Cosyvoice2, "用四川话说这句话"), "用四川话说这句话<|endofprompt|>");
        assert_eq!(instruction_text(LmFamily::Cosyvoice2, "用四川话说这句话<|endofprompt|>"), "用四川话说这句话<|endofprompt|>");
        let want = "You are a helpful assistant. 请用广东话表达。<|endofprompt|>";
        assert_eq!(instruction_text(LmFamily::Cosyvoice3, "请用广东话表达。"), want);
        assert_eq!(instruction_text(LmFamily::Cosyvoice3, want), want, "the reference example's own text is not doubled");
    }
}
