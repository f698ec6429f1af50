-- Voices for the whole fleet (issue 15): a CosyVoice2 voice is a speaker embedding and, for
-- zero-shot voices, a prompt — the recording's speech tokens (25 Hz), its mel (2 frames per
-- token, 80 bins, frame-major) and its transcript's text token ids. `voxbatch voice add` writes
-- them from a recording; a model directory's own voices (the checkpoint's spk2info.pt) are
-- imported when a worker of that model starts (`source = 'checkpoint'`, never overwriting).
-- Workers read this table, cache it and pick up additions, so a new voice needs no redeploy.
-- `version` changes on every write: a worker reloads a voice whose version it has not seen.
CREATE TABLE IF NOT EXISTS voices (
    model                text NOT NULL,
    name                 text NOT NULL CHECK (name <> ''),
    prompt_text          text,
    prompt_text_tokens   integer[] NOT NULL DEFAULT '{}',
    prompt_speech_tokens integer[] NOT NULL DEFAULT '{}',
    -- The flow's prompt tokens when they differ from the LLM's (imported checkpoints); NULL: the same.
    flow_prompt_tokens   integer[],
    prompt_mel           real[] NOT NULL DEFAULT '{}',
    embedding            real[] NOT NULL CHECK (cardinality(embedding) = 192),
    source               text NOT NULL CHECK (source IN ('recording', 'checkpoint')),
    source_sha256        text,
    source_seconds       double precision,
    version              uuid NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, name),
    CHECK (cardinality(prompt_mel) = 80 * 2 * cardinality(coalesce(flow_prompt_tokens, prompt_speech_tokens)))
);
COMMENT ON TABLE voices IS 'CosyVoice2 voices per model, shared by every worker (voxbatch voice add|list|show|rm)';
COMMENT ON COLUMN voices.prompt_mel IS 'the flow''s prompt mel, frame-major: 2 frames per prompt token x 80 bins';
COMMENT ON COLUMN voices.version IS 'new on every write; workers reload voices whose version changed';
