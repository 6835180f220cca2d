"""Start a command with an image's environment applied over the job's, as Pyxis does.

`python pyxis_env.py --image-env NAME=VALUE [...] --container-env NAME[,NAME...] -- COMMAND...`

Pyxis sets each variable of the image's environment over the job's, except those named in
--container-env that the job has set, which keep the job's value (NVIDIA/pyxis
pyxis_slurmstepd.c, spank_import_container_env, commit
107519944221822ea1dace4db8e7234b2eaa4cd5). The tests put this in front of a task where
Pyxis would start the container.
"""

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--container-env", default="", metavar="NAME[,NAME...]")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    kept = set(filter(None, args.container_env.split(",")))
    environment = dict(os.environ)
    for setting in args.image_env:
        name, _, value = setting.partition("=")
        if name in kept and name in environment:
            continue
        environment[name] = value
    os.execvpe(command[0], command, environment)


if __name__ == "__main__":
    main()
