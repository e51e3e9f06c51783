-- A tuning database as autogen wrote it at schema revision 0001 (before trials had cache_mode
-- and spread_us, and before autogen_validations existed). tests/test_tuning_db.py loads it into
-- a fresh SQLite file and opens it with TuningDB, which must migrate it to head keeping every row.
-- The CREATE statements are exactly what migration 0001 emits on SQLite.

CREATE TABLE autogen_alembic_version (
	version_num VARCHAR(32) NOT NULL,
	CONSTRAINT autogen_alembic_version_pkc PRIMARY KEY (version_num)
);
CREATE TABLE autogen_gpus (
	id INTEGER NOT NULL,
	name VARCHAR(128) NOT NULL,
	compute_capability VARCHAR(16) NOT NULL,
	sm_count INTEGER NOT NULL,
	l2_bytes BIGINT NOT NULL,
	CONSTRAINT pk_autogen_gpus PRIMARY KEY (id),
	CONSTRAINT uq_autogen_gpus_key UNIQUE (name, compute_capability)
);
CREATE TABLE autogen_trials (
	id INTEGER NOT NULL,
	gpu_id INTEGER NOT NULL,
	family VARCHAR(64) NOT NULL,
	dtype VARCHAR(32) NOT NULL,
	shape_key VARCHAR(256) NOT NULL,
	kernel_name VARCHAR(256) NOT NULL,
	params TEXT NOT NULL,
	status VARCHAR(16) NOT NULL,
	reason TEXT NOT NULL,
	time_us FLOAT,
	samples_us TEXT NOT NULL,
	error FLOAT,
	source_hash VARCHAR(64) NOT NULL,
	compile_options TEXT NOT NULL,
	driver_version INTEGER NOT NULL,
	runtime_version INTEGER NOT NULL,
	nvrtc_version VARCHAR(32) NOT NULL,
	created_at VARCHAR(32) NOT NULL,
	CONSTRAINT pk_autogen_trials PRIMARY KEY (id),
	CONSTRAINT fk_autogen_trials_gpu_id_autogen_gpus FOREIGN KEY(gpu_id) REFERENCES autogen_gpus (id),
	CONSTRAINT uq_autogen_trials_key UNIQUE (gpu_id, family, dtype, shape_key, kernel_name)
);
CREATE TABLE autogen_winners (
	id INTEGER NOT NULL,
	gpu_id INTEGER NOT NULL,
	family VARCHAR(64) NOT NULL,
	dtype VARCHAR(32) NOT NULL,
	shape_key VARCHAR(256) NOT NULL,
	trial_id INTEGER NOT NULL,
	peer_name VARCHAR(128) NOT NULL,
	peer_time_us FLOAT,
	margin FLOAT,
	autogen_version VARCHAR(64) NOT NULL,
	updated_at VARCHAR(32) NOT NULL,
	CONSTRAINT pk_autogen_winners PRIMARY KEY (id),
	CONSTRAINT fk_autogen_winners_gpu_id_autogen_gpus FOREIGN KEY(gpu_id) REFERENCES autogen_gpus (id),
	CONSTRAINT fk_autogen_winners_trial_id_autogen_trials FOREIGN KEY(trial_id) REFERENCES autogen_trials (id),
	CONSTRAINT uq_autogen_winners_key UNIQUE (gpu_id, family, dtype, shape_key)
);
CREATE INDEX ix_autogen_winners_trial_id ON autogen_winners (trial_id);

INSERT INTO autogen_alembic_version (version_num) VALUES ('0001');

INSERT INTO autogen_gpus (id, name, compute_capability, sm_count, l2_bytes) VALUES
	(1, 'NVIDIA H100 80GB HBM3', '9.0', 132, 52428800),
	(2, 'NVIDIA A100-SXM4-40GB', '8.0', 108, 41943040);

INSERT INTO autogen_trials (id, gpu_id, family, dtype, shape_key, kernel_name, params, status,
	reason, time_us, samples_us, error, source_hash, compile_options, driver_version,
	runtime_version, nvrtc_version, created_at) VALUES
	(1, 1, 'gemv', 'float32', 'm=16384,n=16', 'gemv_bm64_tn4', '{"bm": 64, "tn": 4}', 'ok',
	 '', 21.5, '[21.4, 21.5, 21.9]', 1.2e-07, 'a1a1', '--gpu-architecture=sm_90 -O3', 12040,
	 12040, '12.4', '2025-01-10T09:00:00.000001+00:00'),
	(2, 1, 'gemv', 'float32', 'm=16384,n=16', 'gemv_bm128_tn8', '{"bm": 128, "tn": 8}', 'ok',
	 '', 18.25, '[18.2, 18.25, 18.4]', 9.5e-08, 'b2b2', '--gpu-architecture=sm_90 -O3', 12040,
	 12040, '12.4', '2025-01-10T09:00:01.000002+00:00'),
	(3, 1, 'gemv', 'float32', 'm=16384,n=16', 'gemv_bm256_tn16', '{"bm": 256, "tn": 16}', 'failed',
	 'too many resources requested for launch', NULL, '[]', NULL, 'c3c3',
	 '--gpu-architecture=sm_90 -O3', 12040, 12040, '12.4', '2025-01-10T09:00:02.000003+00:00'),
	(4, 2, 'gemv', 'float32', 'm=4096,n=4096', 'gemv_bm64_tn4', '{"bm": 64, "tn": 4}', 'ok',
	 '', 112.0, '[111.5, 112.0, 113.0]', 2.0e-07, 'a1a1', '--gpu-architecture=sm_80 -O3', 12020,
	 12020, '12.2', '2025-01-11T14:30:00.000000+00:00');

INSERT INTO autogen_winners (id, gpu_id, family, dtype, shape_key, trial_id, peer_name,
	peer_time_us, margin, autogen_version, updated_at) VALUES
	(1, 1, 'gemv', 'float32', 'm=16384,n=16', 2, 'cuBLAS sgemv', 24.0, 0.151, '0.1.0',
	 '2025-01-10T09:00:05.000000+00:00'),
	(2, 2, 'gemv', 'float32', 'm=4096,n=4096', 4, '', NULL, NULL, '0.1.0',
	 '2025-01-11T14:30:05.000000+00:00');
