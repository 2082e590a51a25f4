"""The weight-sync series built into this tree: generated from the
series and its pin (each patch names its feature); do not edit."""

SERIES = 7
PIN = {"name": "sglang", "version": "0.5.10"}
FEATURES = (
    "watchdog_pause",
    "init_weights_update_group_timeout",
    "health_while_updating",
    "two_phase_weight_update",
    "weights_checksum",
    "secret_redaction",
    "admin_api_key_env",
    "rlsync_info",
    "rank_results",
    "idle_scheduler_yields_to_receiver",
    "data_parallel_weight_update",
    "update_group_on_route",
    "fused_cuda_digest",
    "sync_metrics",
    "shard_staging",
    "apply_outcome_of_every_rank",
    "session_ids",
    "in_band_abort",
    "multi_group_sessions",
)
