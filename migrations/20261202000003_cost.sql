-- Cost accounting: what each worker cost while busy and idle, and report views.
ALTER TABLE workers
    ADD COLUMN gpu_name    text,
    ADD COLUMN hourly_usd  double precision,
    ADD COLUMN busy_ms     double precision NOT NULL DEFAULT 0,   -- inference time
    ADD COLUMN alive_ms    double precision NOT NULL DEFAULT 0;   -- since start (busy + idle)

ALTER TABLE batches
    ADD COLUMN hourly_usd  double precision,                      -- price used for cost_usd
    ADD COLUMN energy_usd  double precision;

-- Each done job with its share of its batch's inference time, cost and energy (by audio length).
CREATE VIEW job_costs AS
SELECT j.job_id, j.campaign, j.chars, j.audio_seconds, j.finished_at,
       date_trunc('day', j.finished_at) AS day,
       b.batch_id, b.batch_size, b.precision, b.model, b.device,
       coalesce(b.gpu_name, CASE WHEN b.device = 'cpu' THEN 'cpu' ELSE b.device END) AS gpu,
       s.share,
       b.infer_ms * s.share / 1000.0 AS gpu_seconds,
       b.cost_usd * s.share AS cost_usd,
       b.gpu_energy_j * s.share AS energy_j,
       b.gpu_util_mean AS gpu_util_mean
FROM jobs j
JOIN batches b ON b.batch_id = j.batch_id
CROSS JOIN LATERAL (SELECT CASE WHEN b.audio_seconds > 0 THEN j.audio_seconds / b.audio_seconds ELSE 0 END AS share) s
WHERE j.status = 'done';

-- One summary for every grouping: jobs, characters, audio hours, GPU hours, real-time factor
-- (inference seconds per audio second), audio-seconds per GPU-second, cost, $ per audio hour and per
-- million characters, utilisation (NVML, weighted by inference time), energy.
-- `dimension` is one of campaign, day, batch_size, precision, gpu, model, or total (one row).
CREATE FUNCTION cost_by(dimension text, since timestamptz DEFAULT '-infinity', only_campaign text DEFAULT NULL)
RETURNS TABLE (key text, jobs bigint, chars bigint, audio_hours float8, gpu_hours float8, real_time_factor float8,
               audio_s_per_gpu_s float8, cost_usd float8, usd_per_audio_hour float8, usd_per_million_chars float8,
               gpu_util_mean float8, energy_kwh float8)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    key_expr text;
BEGIN
    IF dimension NOT IN ('campaign', 'day', 'batch_size', 'precision', 'gpu', 'model', 'total') THEN
        RAISE EXCEPTION 'unknown report dimension %: use campaign, day, batch_size, precision, gpu, model or total', dimension;
    END IF;
    key_expr := CASE WHEN dimension = 'total' THEN quote_literal('TOTAL') ELSE quote_ident(dimension) END;
    RETURN QUERY EXECUTE format($q$
        SELECT %s::text, count(*), sum(chars)::bigint, sum(audio_seconds) / 3600, sum(gpu_seconds) / 3600,
               sum(gpu_seconds) / nullif(sum(audio_seconds), 0), sum(audio_seconds) / nullif(sum(gpu_seconds), 0),
               sum(cost_usd), sum(cost_usd) / nullif(sum(audio_seconds) / 3600, 0),
               sum(cost_usd) / nullif(sum(chars)::float8 / 1e6, 0),
               (sum(gpu_util_mean * gpu_seconds) / nullif(sum(gpu_seconds) FILTER (WHERE gpu_util_mean IS NOT NULL), 0))::float8,
               sum(energy_j) / 3.6e6
        FROM job_costs
        WHERE finished_at >= $1 AND ($2::text IS NULL OR campaign = $2)
        GROUP BY 1 ORDER BY 1 $q$, key_expr)
    USING since, only_campaign;
END
$fn$;

CREATE VIEW cost_by_campaign   AS SELECT * FROM cost_by('campaign');
CREATE VIEW cost_by_day        AS SELECT * FROM cost_by('day');
CREATE VIEW cost_by_batch_size AS SELECT * FROM cost_by('batch_size');
CREATE VIEW cost_by_precision  AS SELECT * FROM cost_by('precision');
CREATE VIEW cost_by_gpu        AS SELECT * FROM cost_by('gpu');
CREATE VIEW cost_by_model      AS SELECT * FROM cost_by('model');

-- Workers: busy vs idle time and what idling cost.
CREATE VIEW worker_utilisation AS
SELECT worker_id, host, device, gpu_name, hourly_usd, started_at, last_heartbeat, stopped_at,
       busy_ms / 3.6e6 AS busy_hours, greatest(alive_ms - busy_ms, 0) / 3.6e6 AS idle_hours,
       busy_ms / nullif(alive_ms, 0) AS utilisation,
       alive_ms / 3.6e6 * hourly_usd AS cost_usd,
       greatest(alive_ms - busy_ms, 0) / 3.6e6 * hourly_usd AS idle_cost_usd
FROM workers;
