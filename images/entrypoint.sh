#!/bin/sh
# The image's entrypoint, behind tini: `docker run IMAGE --config job.toml` trains, as
# `docker run IMAGE python -m training --config job.toml` does. Arguments that start with
# an option are the trainer's (the official images' idiom, docker-library/postgres
# docker-entrypoint.sh: "if first arg looks like a flag, assume we want to run postgres
# server"); any other command runs as given (`python ...`, `bash`). exec: the command
# replaces this shell, so tini's SIGTERM reaches it directly.
set -eu
if [ "$#" -gt 0 ] && [ "${1#-}" != "$1" ]; then
  set -- python -m training "$@"
fi
exec "$@"
