-- Which kernels a batch's flow-matching steps ran on (CosyVoice2 models, issue 16): 'compiled'
-- (the model directory's AOTInductor package for this GPU, torch and precision), 'eager' (the tch
-- port), 'mixed' (parts outside the package's batch or length limits ran eager); NULL for models
-- without such steps.
ALTER TABLE batches ADD COLUMN IF NOT EXISTS kernels text CHECK (kernels IN ('compiled', 'eager', 'mixed'));
