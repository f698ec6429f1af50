//! What the LLM is given for a job's segments, per CosyVoice2 mode (`cosyvoice/cli/frontend.py`):
//! zero-shot — the voice's prompt text and prompt speech tokens (`frontend_zero_shot`); cross-lingual
//! — neither (`frontend_cross_lingual`); instruct — the instruction followed by `<|endofprompt|>` as
//! the prompt text, no prompt speech tokens (`frontend_instruct2`). Every segment samples from its
//! own stream, seeded by job id and segment index, so a retried job samples the same tokens.
//!
//! Neighbours: `frontend` makes the segments' token ids (and the instruction's); `speech_lm`
//! decodes the requests; `job::Mode` is the job's choice.

use super::sampler::sequence_seed;
use super::request::LmRequest;
use crate::job::Mode;
use crate::model::cosyvoice2::Voice;

/// The special token that closes an instruction (CosyVoice2's added token).
pub const END_OF_PROMPT: &str = "<|endofprompt|>";

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
/// the job's instruction followed by [`END_OF_PROMPT`] (mode instruct only).
pub fn requests(
    job_id: uuid::Uuid,
    segments: &[Vec<i64>],
    voice_name: &str,
    voice: &Voice,
    mode: Option<Mode>,
    instruction: Option<&[i64]>,
) -> Result<Vec<LmRequest>, PromptError> {
    let mode = mode.unwrap_or_else(|| default_mode(voice));
    let (prompt_text, prompt_speech): (Vec<i64>, Vec<i64>) = match mode {
        Mode::ZeroShot if !has_prompt(voice) => return Err(PromptError::NoPrompt(voice_name.to_string())),
        Mode::ZeroShot => (voice.prompt_text.clone(), voice.llm_prompt_tokens.clone()),
        Mode::CrossLingual => (Vec::new(), Vec::new()),
        Mode::Instruct => (instruction.ok_or(PromptError::NoInstruction)?.to_vec(), Vec::new()),
    };
    Ok(segments
        .iter()
        .enumerate()
        .map(|(i, text)| LmRequest {
            text: text.clone(),
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
        let zs = requests(job, &segs, "narrator", &v, None, None).unwrap();
        assert_eq!((zs[0].prompt_text.as_slice(), zs[0].prompt_speech.as_slice()), (&[9, 9][..], &[100, 101, 102][..]), "zero-shot by default");
        assert_ne!(zs[0].seed, zs[1].seed, "each segment its own stream");
        assert_eq!(zs[1].seed, requests(job, &segs, "narrator", &v, None, None).unwrap()[1].seed, "and the same on a retry");
        let cl = requests(job, &segs, "narrator", &v, Some(Mode::CrossLingual), None).unwrap();
        assert!(cl.iter().all(|r| r.prompt_text.is_empty() && r.prompt_speech.is_empty()));
        let ins = requests(job, &segs, "narrator", &v, Some(Mode::Instruct), Some(&[7, 8, 400])).unwrap();
        assert_eq!((ins[1].prompt_text.as_slice(), ins[1].prompt_speech.len(), ins[1].text.as_slice()), (&[7, 8, 400][..], 0, &[4, 5][..]));
        assert_eq!(requests(job, &segs, "narrator", &v, Some(Mode::Instruct), None).unwrap_err(), PromptError::NoInstruction);
        // A voice without a prompt: cross-lingual by default, zero-shot refused with what to do.
        let plain = voice(vec![], vec![]);
        assert_eq!(default_mode(&plain), Mode::CrossLingual);
        let e = requests(job, &segs, "plain", &plain, Some(Mode::ZeroShot), None).unwrap_err();
        assert!(e.to_string().contains("use cross_lingual"), "{e}");
    }
}
