-- The error calibration judges a fit by (`calibrate::accept_fit`): the largest |predicted − measured|
-- over the points as a share of the largest peak measured. NULL for rows recorded before it
-- existed (their `profile` column holds the points it can be computed from).
ALTER TABLE calibrations ADD COLUMN IF NOT EXISTS worst_error_of_max_peak double precision;
