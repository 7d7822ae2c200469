-- An image's copy for the model: what the CLI would send anyway (it re-encodes an image over its byte budget
-- or its size limits as a JPEG before every request), made once at upload instead of by the CLI on every
-- turn that carries it. NULL when the stored image is already within those limits (it goes as it is).
ALTER TABLE attachments ADD COLUMN model_data bytea,
    ADD COLUMN model_media_type text CHECK (model_media_type IN ('image/jpeg', 'image/png')),
    ADD CONSTRAINT attachments_model_copy CHECK ((model_data IS NULL) = (model_media_type IS NULL));
GRANT INSERT (model_data, model_media_type) ON attachments TO petal_ingress;
