"""The console gets the trainer's own lines and every error; libraries' warnings go to the log.

DeepSpeed and torch warn at every start about things the user cannot act on (a
deprecated collective DeepSpeed itself calls, a scheduler read before its first
step, the accelerator it picked). A worker writes everything to
<output_dir>/logs/rank<N>.log; those warnings go there only. Errors, from anyone,
and the trainer's own warnings still reach the console. Torch-free: installed
before torch and DeepSpeed are imported, so that warnings at import time are kept too.
"""

from __future__ import annotations

import logging
from pathlib import Path

# DeepSpeed's logger prints to stdout through a handler of its own and does not propagate
# (deepspeed/utils/logging.py, LoggerFactory.create_logger).
DEEPSPEED_LOGGER = "DeepSpeed"
# Loggers (and their children) whose warnings stay off the console; boto3's say at INFO
# where they found credentials and the endpoint, on every start that reads S3.
_LIBRARIES = (
    "py.warnings",
    "torch",
    "deepspeed",
    "transformers",
    "huggingface_hub",
    "datasets",
    "accelerate",
    "httpx",
    "filelock",
    "botocore",
    "boto3",
    "s3transfer",
    "urllib3",
)
FORMAT = "%(asctime)s [{where}] %(levelname)s %(name)s: %(message)s"

_held: list[logging.LogRecord] = []  # kept until the log file is known
_file: logging.Handler | None = None


def divert_library_warnings() -> None:
    """Before torch and DeepSpeed are imported: their warnings go to the log file."""
    logging.captureWarnings(True)  # warnings.warn(...) becomes a py.warnings record
    logging.getLogger(DEEPSPEED_LOGGER).addFilter(_deepspeed_to_file)


def console_filter(record: logging.LogRecord) -> bool:
    """For the console handler: False for a library's record below ERROR."""
    if record.levelno >= logging.ERROR or not record.name.startswith(_LIBRARIES):
        return True
    if _file is None:
        _held.append(record)  # the root's file handler will have it otherwise
    return False


# Hugging Face libraries print through a stream handler of their own on their root logger,
# and transformers' does not propagate (_configure_library_root_logger in
# transformers/utils/logging.py, huggingface_hub/utils/logging.py, datasets/utils/logging.py).
_OWN_HANDLERS = ("transformers", "huggingface_hub", "datasets")


def adopt_hf_loggers() -> None:
    """Send the Hugging Face libraries' records through the root's handlers, as everyone's:
    their warnings (a download retried, weights newly initialised) go to the log file,
    their errors to the console. Imports them: call it where they are used."""
    import datasets.utils.logging  # noqa: F401
    import huggingface_hub.utils.logging  # noqa: F401
    import transformers.utils.logging

    transformers.utils.logging.get_logger()  # configures its root logger, once
    for name in _OWN_HANDLERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


def write_to(path: Path, where: str) -> None:
    """From now on every record also goes to ``path``, held ones first."""
    global _file
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(FORMAT.format(where=where), "%H:%M:%S"))
    for record in _held:
        handler.handle(record)
    _held.clear()
    _file = handler
    logging.getLogger().addHandler(handler)


def _deepspeed_to_file(record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR:
        return True
    if _file is None:
        _held.append(record)
    else:
        _file.handle(record)
    return False
