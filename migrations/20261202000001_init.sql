-- voxbatch schema v1: workers, batches, jobs, rejections.
-- Every timestamp is timestamptz (UTC on the wire). Durations are milliseconds (double precision).

CREATE TABLE workers (
    worker_id      text PRIMARY KEY,
    host           text NOT NULL,
    pid            integer,
    device         text NOT NULL,
    model          text,
    precision      text,
    started_at     timestamptz NOT NULL DEFAULT now(),
    last_heartbeat timestamptz NOT NULL DEFAULT now(),
    stopped_at     timestamptz
);

CREATE TABLE batches (
    batch_id       uuid PRIMARY KEY,
    worker_id      text NOT NULL REFERENCES workers (worker_id),
    model          text NOT NULL,
    device         text NOT NULL,
    precision      text NOT NULL,
    batch_size     integer NOT NULL CHECK (batch_size > 0),
    tokens         bigint NOT NULL,          -- sum of input tokens
    padded_tokens  bigint NOT NULL,          -- batch_size x longest input
    flush_reason   text NOT NULL,            -- why the batch was closed: full, tokens, deadline, drain
    queue_ms       double precision NOT NULL,-- oldest job's wait in the worker before inference
    infer_ms       double precision NOT NULL,
    encode_ms      double precision NOT NULL,
    upload_ms      double precision NOT NULL,
    db_ms          double precision NOT NULL,-- claim + commit
    audio_seconds  double precision NOT NULL,
    started_at     timestamptz NOT NULL,
    finished_at    timestamptz NOT NULL,
    -- Filled by later stages (memory policy, GPU metrics, cost); NULL when not measured.
    predicted_peak_bytes   bigint,
    measured_peak_bytes    bigint,
    padding_waste          real,
    gpu_name               text,
    gpu_util_mean          real,
    gpu_util_max           real,
    gpu_mem_used_max_bytes bigint,
    gpu_power_mean_w       real,
    gpu_energy_j           double precision,
    gpu_temp_max_c         real,
    gpu_sm_clock_mean_mhz  real,
    process_mem_max_bytes  bigint,
    cost_usd               double precision
);
CREATE INDEX batches_finished_at ON batches (finished_at);
CREATE INDEX batches_worker_id ON batches (worker_id);
CREATE INDEX batches_model_precision ON batches (model, precision, batch_size);

CREATE TABLE jobs (
    job_id        uuid PRIMARY KEY,
    campaign      text NOT NULL,
    voice         text NOT NULL,
    text          text NOT NULL,
    priority      smallint NOT NULL DEFAULT 0,
    metadata      jsonb,
    status        text NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed', 'rejected')),
    attempts      integer NOT NULL DEFAULT 0,
    s3_key        text,
    audio_seconds double precision,
    audio_sha256  text,
    chars         integer NOT NULL,
    error         text,
    batch_id      uuid REFERENCES batches (batch_id),
    worker_id     text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz
);
CREATE INDEX jobs_campaign_status ON jobs (campaign, status);
CREATE INDEX jobs_status ON jobs (status);
CREATE INDEX jobs_finished_at ON jobs (finished_at);
CREATE INDEX jobs_batch_id ON jobs (batch_id);

-- Every message dead-lettered by a worker, with its reason (also for messages with no readable job_id).
CREATE TABLE rejections (
    id              bigserial PRIMARY KEY,
    job_id          uuid,
    code            text NOT NULL,
    reason          text NOT NULL,
    payload_bytes   integer NOT NULL,
    payload_excerpt text,                    -- first 256 characters, lossily decoded, NUL removed
    worker_id       text,
    received_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rejections_job_id ON rejections (job_id);
CREATE INDEX rejections_received_at ON rejections (received_at);
