-- CosyVoice2 text jobs run in two stages on the model thread: the speech-token LM ('llm') and
-- token2wav ('token2wav'), interleaved inside each batch. Each batch records one row per stage:
-- the stage's device time (synchronised on the model thread), the segments it processed, the
-- speech tokens it produced (llm) or turned into audio (token2wav), and its share of the batch's
-- inference time, cost and energy. NVML samples cannot tell the stages apart (they alternate
-- within milliseconds), so energy and cost are split by device time.
CREATE TABLE IF NOT EXISTS batch_stages (
    batch_id     uuid NOT NULL REFERENCES batches (batch_id) ON DELETE CASCADE,
    stage        text NOT NULL CHECK (stage IN ('llm', 'token2wav')),
    seconds      double precision NOT NULL,
    items        integer NOT NULL,
    tokens       bigint NOT NULL,
    share        double precision NOT NULL,
    gpu_energy_j double precision,
    cost_usd     double precision,
    PRIMARY KEY (batch_id, stage)
);

-- Segments a text job was synthesized as (NULL for jobs of single-stage models).
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS segments integer;
COMMENT ON COLUMN jobs.segments IS 'segments of a CosyVoice2 text job (the LLM''s units), NULL otherwise';

-- Each done job's share of each stage of its batch. A job's share of its batch is its audio over
-- the batch's audio (job_costs): the sum of its segments' shares, however many segments it had.
CREATE VIEW stage_costs AS
SELECT jc.job_id, jc.campaign, jc.chars, jc.audio_seconds, jc.finished_at, jc.day, jc.batch_id, jc.batch_size,
       jc.precision, jc.model, jc.device, jc.gpu, st.stage,
       jc.gpu_seconds * st.share AS gpu_seconds,
       jc.cost_usd * st.share AS cost_usd,
       jc.energy_j * st.share AS energy_j,
       jc.gpu_util_mean
FROM job_costs jc
JOIN batch_stages st ON st.batch_id = jc.batch_id;

-- cost_by gains the dimension 'stage' (rows from stage_costs: each stage's GPU time, cost and
-- throughput over the jobs it served; a job's audio and characters count once in each stage).
CREATE OR REPLACE FUNCTION cost_by(dimension text, since timestamptz DEFAULT '-infinity', only_campaign text DEFAULT NULL)
RETURNS TABLE (key text, jobs bigint, chars bigint, audio_hours float8, gpu_hours float8, real_time_factor float8,
               audio_s_per_gpu_s float8, cost_usd float8, usd_per_audio_hour float8, usd_per_million_chars float8,
               gpu_util_mean float8, energy_kwh float8)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    key_expr text;
    source text;
BEGIN
    IF dimension NOT IN ('campaign', 'day', 'batch_size', 'precision', 'gpu', 'model', 'stage', 'total') THEN
        RAISE EXCEPTION 'unknown report dimension %: use campaign, day, batch_size, precision, gpu, model, stage or total', dimension;
    END IF;
    key_expr := CASE WHEN dimension = 'total' THEN quote_literal('TOTAL') ELSE quote_ident(dimension) END;
    source := CASE WHEN dimension = 'stage' THEN 'stage_costs' ELSE 'job_costs' END;
    RETURN QUERY EXECUTE format($q$
        SELECT %s::text, count(*), sum(chars)::bigint, sum(audio_seconds) / 3600, sum(gpu_seconds) / 3600,
               sum(gpu_seconds) / nullif(sum(audio_seconds), 0), sum(audio_seconds) / nullif(sum(gpu_seconds), 0),
               sum(cost_usd), sum(cost_usd) / nullif(sum(audio_seconds) / 3600, 0),
               sum(cost_usd) / nullif(sum(chars)::float8 / 1e6, 0),
               (sum(gpu_util_mean * gpu_seconds) / nullif(sum(gpu_seconds) FILTER (WHERE gpu_util_mean IS NOT NULL), 0))::float8,
               sum(energy_j) / 3.6e6
        FROM %s
        WHERE finished_at >= $1 AND ($2::text IS NULL OR campaign = $2)
        GROUP BY 1 ORDER BY 1 $q$, key_expr, source)
    USING since, only_campaign;
END
$fn$;

CREATE VIEW cost_by_stage AS SELECT * FROM cost_by('stage');
