-- Memory-aware batching: calibration profiles and per-batch OOM/split events.

CREATE TABLE calibrations (
    id                 bigserial PRIMARY KEY,
    model              text NOT NULL,
    gpu_name           text NOT NULL,           -- NVML device name, or 'cpu'
    precision          text NOT NULL,
    m0_bytes           double precision NOT NULL,  -- peak(B, L) = m0 + B·(a·L + b·L²), L in output frames
    a_bytes_per_frame  double precision NOT NULL,
    b_bytes_per_frame2 double precision NOT NULL,
    r2                 double precision NOT NULL,
    worst_rel_error    double precision NOT NULL,
    points             integer NOT NULL,
    total_memory_bytes bigint NOT NULL,
    vram_fraction      double precision NOT NULL,
    profile            jsonb NOT NULL,          -- the whole profile, points included
    created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX calibrations_lookup ON calibrations (model, gpu_name, precision, created_at DESC);

-- Out-of-memory errors, splits and jobs that failed alone, per batch.
CREATE TABLE batch_events (
    id          bigserial PRIMARY KEY,
    batch_id    uuid NOT NULL,                  -- the batch as assembled (its row exists once committed)
    worker_id   text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('oom', 'split', 'failed_alone')),
    batch_size  integer NOT NULL,
    max_tokens  integer,
    detail      text,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX batch_events_batch_id ON batch_events (batch_id);
CREATE INDEX batch_events_kind_at ON batch_events (kind, at);
