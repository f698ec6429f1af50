//! Flags of `voxbatch voice …` and `voxbatch dead …`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use voxbatch::commands::{DeadAction, DeadFilter};
use voxbatch::report::Format;

/// Which dead-lettered messages a `dead` command acts on.
#[derive(Args, Debug, Clone)]
pub struct DeadSelect {
    /// Only jobs of this campaign.
    #[arg(long)]
    pub campaign: Option<String>,
    /// Only messages rejected with this code (e.g. `unknown_voice`; `broker` for messages the
    /// broker dead-lettered at the delivery limit).
    #[arg(long)]
    pub code: Option<String>,
    /// At most N matching messages.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

#[derive(Subcommand, Debug)]
pub enum DeadCommand {
    /// What the dead-letter queue holds: job, campaign, code, reason, when, attempts. Nothing is
    /// consumed: every message stays in the queue.
    List {
        #[command(flatten)]
        select: DeadSelect,
        /// table, csv or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Republish matching messages to the job queue (broker-confirmed, then removed from the
    /// dead-letter queue; safe to interrupt and run again: it says how many it moved).
    Requeue {
        #[command(flatten)]
        select: DeadSelect,
        /// Say what would be requeued; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// table, csv or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Remove matching messages from the dead-letter queue for good (their rows stay in Postgres).
    Purge {
        #[command(flatten)]
        select: DeadSelect,
        /// Required: purging cannot be undone.
        #[arg(long)]
        yes: bool,
        /// table, csv or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
}

impl DeadCommand {
    /// What to do, to which messages, and how to print it.
    pub fn parts(self) -> anyhow::Result<(DeadFilter, DeadAction, Format)> {
        let (select, action, format) = match self {
            DeadCommand::List { select, format } => (select, DeadAction::List, format),
            DeadCommand::Requeue { select, dry_run, format } => (select, DeadAction::Requeue { dry_run }, format),
            DeadCommand::Purge { yes: false, .. } => {
                anyhow::bail!("dead purge removes messages for good: add --yes (try `voxbatch dead list` with the same filters first)")
            }
            DeadCommand::Purge { select, format, .. } => (select, DeadAction::Purge, format),
        };
        Ok((DeadFilter { campaign: select.campaign, code: select.code, limit: select.limit }, action, format))
    }
}

#[derive(Subcommand, Debug)]
pub enum VoiceCommand {
    /// Register a zero-shot voice from a 1-30 s recording (WAV, FLAC, MP3 or Ogg Vorbis) and the
    /// words spoken in it. Running workers of the model pick it up without a restart.
    Add {
        /// The voice's name, as jobs give it (`"voice": "NAME"`): A-Z a-z 0-9 . _ -
        name: String,
        /// The prompt recording.
        #[arg(long, value_name = "FILE")]
        audio: PathBuf,
        /// Its transcript.
        #[arg(long)]
        text: String,
        /// The converted CosyVoice2 model directory; default: [model] dir.
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
        /// Overwrite a voice of that name.
        #[arg(long)]
        replace: bool,
        /// table or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// The model's voices: those registered in Postgres and the model directory's own (which a
    /// worker imports when it starts), each with whether it has a zero-shot prompt.
    List {
        /// The converted CosyVoice2 model directory whose voices to list; default: [model] dir.
        #[arg(long, value_name = "DIR", conflicts_with = "all")]
        model: Option<PathBuf>,
        /// Every model's voices in Postgres (and the configured model directory's own).
        #[arg(long)]
        all: bool,
        /// table, csv or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// One voice: its prompt, transcript, source recording, and whether it has a zero-shot prompt.
    Show {
        /// The voice's name.
        name: String,
        /// The converted CosyVoice2 model directory the voice belongs to; default: [model] dir.
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
        /// table or json.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Remove a voice; workers forget it at their next refresh and refuse jobs naming it.
    Rm {
        /// The voice's name.
        name: String,
        /// The converted CosyVoice2 model directory the voice belongs to; default: [model] dir.
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
    },
}
