"""Every HDF5 object the TF reader uses is found inside the file and stored in it.

HDF5 can reach outside its file in three ways, each resolved by the library as soon as the object
is opened, so they are checked before it is: an **external link** (a link naming another file),
**external storage** (a dataset whose raw bytes live in other files: ``/dev/zero``, a FIFO) and a
**virtual dataset** (a mapping onto datasets of other files).  Keras never writes any of them; a
file holding one on a path the reader uses is refused in one line, naming it.  Soft links stay
inside the file: they are followed here by hand (at most :data:`MAX_HOPS`, so a loop ends), and a
dangling one is one line too.  A dataset must have a shape (a null dataspace has none).

:func:`confined_dataset` returns the dataset's path with every soft link resolved: a path of hard
links only, which the reader then opens.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecboundError

MAX_HOPS = 32  # soft links followed for one path (HDF5's own limit is 16 nested)


def _refuse(path: Path, where: str, what: str, fix: str = "re-save the model with save_pretrained") -> SpecboundError:
    return SpecboundError(
        f"{path}: {where} {what}; specbound reads only what is stored in the file itself "
        f"(Keras never writes this): {fix}"
    )


def resolve(h5py, handle, location: str, path: Path) -> str:
    """The hard-link path of ``location`` (``/``-separated, from the root), every component's
    link checked: hard links and soft links inside the file only."""
    parts = [p for p in location.split("/") if p]
    done: list[str] = []
    hops, via = 0, ""
    while parts:
        name = parts.pop(0)
        if name == ".":
            continue
        group = handle["/" + "/".join(done)] if done else handle["/"]
        if not isinstance(group, h5py.Group):
            raise _refuse(path, f"{location!r}:", f"{'/'.join(done)!r} is not a group", "re-download it")
        link = group.get(name, getlink=True)
        if link is None:
            raise SpecboundError(
                f"{path}: {location!r} is listed but absent ({'/'.join([*done, name])!r} is not in "
                f"the file{via}); the file is truncated or corrupt: re-download it"
            )
        if isinstance(link, h5py.HardLink):
            done.append(name)
        elif isinstance(link, h5py.SoftLink):
            hops += 1
            if hops > MAX_HOPS:
                raise _refuse(
                    path, f"{location!r}", f"passes more than {MAX_HOPS} soft links (a loop?)", "re-download it"
                )
            via = f", reached through the soft link {'/'.join([*done, name])!r} -> {link.path!r}"
            target = [p for p in str(link.path).split("/") if p]
            if str(link.path).startswith("/"):
                done = []
            parts = target + parts
        elif isinstance(link, h5py.ExternalLink):
            raise _refuse(path, f"{'/'.join([*done, name])!r} is an external link", f"to {link.filename!r}")
        else:
            raise _refuse(path, f"{'/'.join([*done, name])!r} is a", f"{type(link).__name__} (a user-defined link)")
    return "/" + "/".join(done)


def confined_dataset(h5py, handle, location: str, path: Path) -> str:
    """The hard-link path of the dataset at ``location``, checked to be a dataset stored in the
    file itself with a shape (module docstring)."""
    hard = resolve(h5py, handle, location, path)
    obj = handle[hard]
    where = f"the dataset {location!r}"
    if not isinstance(obj, h5py.Dataset):
        raise SpecboundError(
            f"{path}: {location!r} is a {type(obj).__name__}, not a dataset; the file is not "
            f"Keras weights: re-save the model with save_pretrained"
        )
    if obj.is_virtual:
        sources = sorted({m.file_name for m in obj.virtual_sources()})
        raise _refuse(path, where, f"is a virtual dataset mapped onto {', '.join(map(repr, sources[:3]))}")
    if obj.external:
        raise _refuse(path, where, f"keeps its bytes in external storage ({obj.external[0][0]!r})")
    if obj.shape is None:
        raise SpecboundError(
            f"{path}: {where} has a null dataspace (no shape, no values); the file is "
            f"corrupt: re-save the model with save_pretrained"
        )
    return hard
