-- Where each executor runs tasks without a project (PETAL_WORKDIR, absolute): the page, /api/info and `status`
-- show it from the executor's own row, not from the ingress's settings (the executor decides where it spawns).
ALTER TABLE executors ADD COLUMN workdir text;
