"""Where a Hugging Face model's files come from: `model.hf` names a local folder, an S3
prefix or a model on the Hub; each ends as a local folder that transformers loads.

The launcher fetches once per node, before any rank starts (`fetch`); the ranks then
find the same folder without the network (`local_folder`). Hub models go to
huggingface_hub's own cache (HF_HOME, default ~/.cache/huggingface: mount it into a
container to keep it), S3 prefixes to TRAIN_CACHE_DIR/models. HF_TOKEN is read by
huggingface_hub from the environment (a gated or private model needs it); it is never
part of a message.

Each way the Hub can refuse becomes one line: a model that does not exist, a gated model
without a token (or with one that lacks access), a revision that does not exist, no
connection to the Hub and no copy in the cache. huggingface_hub raises these as
RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError and LocalEntryNotFoundError
(huggingface_hub/utils/_http.py `hf_raise_for_status`, file_download.py, v2.4.0).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from training.spec.config import Config, ConfigError

CONFIG_FILE = "config.json"
OBJECTS_RECORD = ".s3-objects.json"  # in a copy of an s3:// model: what it was copied from
# A tokenizer's files, in every format transformers reads.
TOKENIZER_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.model",  # SentencePiece: tokenizer.model, spiece.model
    "*.tiktoken",
    "chat_template.*",
)
# What a model folder needs besides its weights: the architecture, the tokenizer and
# generation defaults, which the export carries on.
MODEL_FILES = (CONFIG_FILE, "generation_config.json", *TOKENIZER_FILES)
_SAFETENSORS = ["*.safetensors", "*.safetensors.index.json"]
_PICKLED = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]


def is_s3(source: str) -> bool:
    return source.startswith("s3://")


def is_local(source: str) -> bool:
    """A folder on this machine (or a path meant as one: it starts like a path)."""
    return Path(source).expanduser().is_dir() or source.startswith(("/", "./", "../", "~"))


def s3_cache_folder(source: str, cache_dir: Path) -> Path:
    """Where an s3:// model is kept on this node: named after its URI, holding the objects'
    keys and ETags it was copied from (OBJECTS_RECORD)."""
    return cache_dir / "models" / hashlib.sha256(source.rstrip("/").encode()).hexdigest()[:16]


def fetch(config: Config, cache_dir: Path, *, weights: bool = True) -> Path:
    """The model's local folder, downloaded first when it is remote (the launcher's step,
    once per node). `weights=False` fetches config.json and the tokenizer only."""
    source = config.model.hf
    if is_local(source):
        return _local_folder(source)
    if is_s3(source):
        return _fetch_s3(source, cache_dir)
    return _fetch_hub(config, weights=weights)


def local_folder(config: Config, cache_dir: Path) -> Path:
    """The folder `fetch` left on this node, found without the network (every rank)."""
    source = config.model.hf
    if is_local(source):
        return _local_folder(source)
    if is_s3(source):
        folder = s3_cache_folder(source, cache_dir)
        if not folder.is_dir():
            raise ConfigError(f"model.hf = {source!r} was not fetched to {folder}")
        return folder
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(source, revision=config.model.revision, local_files_only=True))


def config_file(config: Config) -> Path:
    """config.json alone (for `estimate`: no weights, no tokenizer)."""
    source = config.model.hf
    if is_local(source):
        return _local_folder(source) / CONFIG_FILE
    if is_s3(source):
        import tempfile

        from training.s3_folders import download_object, exists

        uri = f"{source.rstrip('/')}/{CONFIG_FILE}"
        if not exists(uri):
            raise ConfigError(
                f"model.hf = {source!r} holds no {CONFIG_FILE}: upload a save_pretrained "
                "folder there (config.json, weights, tokenizer)"
            )
        path = Path(tempfile.mkdtemp(prefix="hf-config-")) / CONFIG_FILE
        download_object(uri, path)
        return path
    return _hub_download(config, CONFIG_FILE)


def _local_folder(source: str) -> Path:
    folder = Path(source).expanduser()
    if not folder.is_dir():
        raise ConfigError(
            f"model.hf = {source!r} is not a folder on this machine: give a folder holding "
            "config.json, a Hub id such as 'meta-llama/Llama-3.1-8B', or s3://bucket/prefix"
        )
    if not (folder / CONFIG_FILE).is_file():
        raise ConfigError(
            f"model.hf = {source!r} has no {CONFIG_FILE}: point it at a Hugging Face model "
            "folder (config.json, weights, tokenizer), e.g. one save_pretrained wrote"
        )
    return folder


def _fetch_s3(source: str, cache_dir: Path) -> Path:
    from training.s3_folders import download_folder, list_objects, split_uri

    objects = list_objects(source)
    prefix = split_uri(source)[1]
    if not any(o["Key"] == f"{prefix}/{CONFIG_FILE}" for o in objects):
        raise ConfigError(
            f"model.hf = {source!r} holds no {CONFIG_FILE}: upload a save_pretrained folder "
            "there (config.json, weights, tokenizer)"
        )
    folder = s3_cache_folder(source, cache_dir)
    listing = json.dumps(sorted([o["Key"], o["ETag"]] for o in objects))
    record = folder / OBJECTS_RECORD
    if record.is_file() and record.read_text() == listing:
        return folder  # this node has the prefix as it is
    download_folder(source, folder, objects=objects, record=(OBJECTS_RECORD, listing), replace=True)
    return folder


def _check_repo_id(source: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        raise ConfigError(
            f"model.hf = {source!r} is neither a folder on this machine, s3://bucket/prefix, "
            "nor a Hub model id such as 'meta-llama/Llama-3.1-8B'"
        ) from None


def _hub_download(config: Config, filename: str) -> Path:
    from huggingface_hub import hf_hub_download

    _check_repo_id(config.model.hf)
    try:
        return Path(hf_hub_download(config.model.hf, filename, revision=config.model.revision))
    except Exception as error:
        raise hub_error(config, error) from None


def _fetch_hub(config: Config, *, weights: bool) -> Path:
    """config.json first (its errors say most: missing, gated, offline), then the rest."""
    from huggingface_hub import HfApi, snapshot_download

    _hub_download(config, CONFIG_FILE)
    patterns = [*MODEL_FILES, "preprocessor_config.json"]
    if config.model.trust_remote_code:
        patterns.append("*.py")
    try:
        if weights and config.model.init == "pretrained":
            names = [
                sibling.rfilename
                for sibling in HfApi()
                .model_info(config.model.hf, revision=config.model.revision)
                .siblings
            ]
            # Safetensors when the repository has them: never both copies of the weights.
            has_safetensors = any(name.endswith(".safetensors") for name in names)
            patterns += _SAFETENSORS if has_safetensors else _PICKLED
        folder = snapshot_download(
            config.model.hf, revision=config.model.revision, allow_patterns=patterns
        )
    except Exception as error:
        raise hub_error(config, error) from None
    return Path(folder)


def hub_error(config: Config, error: Exception) -> Exception:
    """One line for what the Hub (or its absence) said about model.hf; other errors as
    they are."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    model = config.model.hf
    page = f"{constants.ENDPOINT}/{model}"
    if isinstance(error, GatedRepoError):
        if get_token() is None:
            return ConfigError(
                f"model.hf = {model!r} is a gated model and HF_TOKEN is not set: accept its "
                f"terms at {page} and set HF_TOKEN to a token of that account (on a stack: "
                "in the shell that runs `up` or `run`)"
            )
        return ConfigError(
            f"model.hf = {model!r} is a gated model that HF_TOKEN's account has no access "
            f"to: request access at {page}, or use a token of an account that has it"
        )
    if isinstance(error, RevisionNotFoundError):
        return ConfigError(
            f"model.revision = {config.model.revision!r} is not a branch, tag or commit of "
            f"{model!r}: see {page}/tree/main"
        )
    if isinstance(error, RepositoryNotFoundError):
        private = "" if get_token() else "; a private model needs HF_TOKEN"
        return ConfigError(
            f"model.hf = {model!r} is not a model on the Hub ({constants.ENDPOINT}): check "
            f"the id{private}"
        )
    if isinstance(error, LocalEntryNotFoundError):
        cache = constants.HF_HOME
        offline = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "no connection"
        return ConfigError(
            f"model.hf = {model!r}: cannot reach the Hub at {constants.ENDPOINT} ({offline}) "
            f"and the model is not in the local cache ({cache}): connect this machine, or "
            "download the model once where there is a network into that cache"
        )
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else "an error"
        return ConfigError(
            f"model.hf = {model!r}: the Hub ({constants.ENDPOINT}) answered {status}: "
            f"{str(error).strip().splitlines()[0]}"
        )
    return error
