"""fabricctl's configuration: one frozen object built from defaults, files, env and flags.

Contract: the settings and their one default each (`settings`: `AppConfig`, its sections,
`ENV_VARS`, `documented`), how they are loaded and printed (`loading`: `load_config`,
`to_toml`, `user_config_path`) and the fleet of servers they list (`fleetspec`). Everything
a caller needs is importable from `fabricctl.config` itself.
"""

from fabricctl.config.loading import SHORTHAND, load_config, to_toml, user_config_path
from fabricctl.config.settings import (
    ENGINES,
    ENV_VARS,
    VLLM_DEVICES,
    AppConfig,
    ConsumerSettings,
    EnvVar,
    MetricsSettings,
    ProducerSettings,
    ServerSettings,
    SimSettings,
    VllmSettings,
    default_data_dir,
    documented,
    key_docs,
)

__all__ = [
    "ENGINES",
    "ENV_VARS",
    "SHORTHAND",
    "VLLM_DEVICES",
    "AppConfig",
    "ConsumerSettings",
    "EnvVar",
    "MetricsSettings",
    "ProducerSettings",
    "ServerSettings",
    "SimSettings",
    "VllmSettings",
    "default_data_dir",
    "documented",
    "key_docs",
    "load_config",
    "to_toml",
    "user_config_path",
]
