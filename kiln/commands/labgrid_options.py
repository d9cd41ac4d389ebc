"""--labgrid PLACE, --labgrid-tag key=value, --lg-env env.yaml: a board on a labgrid farm for
kiln run, verify and bench (kiln.boards.farm does the work; labgrid is the optional extra
kiln-ml[farm])."""
from __future__ import annotations

import contextlib

from kiln.boards.farm import FarmSpec, Lease, parse_tags


def add_farm_arguments(p):
    g = p.add_argument_group("labgrid farm (pip install 'kiln-ml[farm]'; see docs/farm.md)")
    g.add_argument("--labgrid", default=None, metavar="PLACE",
                   help="run on the board of this labgrid place: acquired for the run, released afterwards")
    g.add_argument("--labgrid-tag", action="append", default=[], metavar="KEY=VALUE",
                   help="run on any free place with this tag (repeatable), e.g. board=nucleo-l4r5zi")
    g.add_argument("--lg-env", default=None, metavar="ENV.yaml",
                   help="labgrid environment file naming the place (RemotePlace) and, optionally, "
                        "kiln_board and coordinator_address options and a flashing driver")
    g.add_argument("--lg-coordinator", default=None, metavar="HOST[:PORT]",
                   help="labgrid coordinator (default: the environment file's, $LG_COORDINATOR, 127.0.0.1:20408)")
    g.add_argument("--labgrid-wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for a busy place (a labgrid reservation) instead of failing at once")


def farm_spec(args) -> FarmSpec | None:
    """The farm the arguments name, or None when they name none."""
    if not (args.labgrid or args.labgrid_tag or args.lg_env):
        return None
    return FarmSpec(place=args.labgrid, tags=parse_tags(args.labgrid_tag), env=args.lg_env,
                    coordinator=args.lg_coordinator, wait=args.labgrid_wait)


@contextlib.contextmanager
def farm_lease(args):
    """The acquired Lease the arguments ask for (released when the block ends), or None."""
    spec = farm_spec(args)
    if spec is None:
        yield None
        return
    with Lease(spec) as lease:
        yield lease
