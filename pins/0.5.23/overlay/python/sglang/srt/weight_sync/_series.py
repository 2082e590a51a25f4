"""The weight-sync series built into this tree: generated from the
series and its pin (each patch names its feature); do not edit."""

SERIES = 7
PIN = {"name": "sglang", "version": "0.5.23"}
FEATURES = (
    "two_phase_weight_update",
    "rlsync_info",
    "fused_cuda_digest",
    "secret_redaction",
    "watchdog_pause",
    "health_while_updating",
    "rank_results",
    "admin_api_key_env",
    "init_weights_update_group_timeout",
    "update_group_on_route",
    "idle_scheduler_yields_to_receiver",
    "sync_metrics",
    "data_parallel_weight_update",
    "shard_staging",
    "apply_outcome_of_every_rank",
    "session_ids",
    "in_band_abort",
    "multi_group_sessions",
)
