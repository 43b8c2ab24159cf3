"""Collectives over HMC sessions (upstream's ``hmc.collective``), implemented in Go.

Members rendezvous through ``torch.distributed`` when it is initialised (``all_gather_object``),
else through the config store (``store=`` URL or ``hmc.store.Store``, or ``HMC_STORE_URL`` and
``HMC_WORLD_SIZE`` in the environment), else from an explicit member list. ``alltoall`` stages the send payload into the session's
buffer, runs the Go all-to-all (``direct``, or a ``ring`` that really is an all-to-all), and
copies the receive area out.
"""

import ctypes
import json
import os
from dataclasses import asdict, dataclass

from . import ConnType, DEFAULT_TIMEOUT, _check, _dest, _ms, _source
from ._lib import LIB as _L

__all__ = ["GroupMember", "Group", "init_group", "alltoall"]

_ALGOS = {"auto": 0, "direct": 1, "ring": 2}


@dataclass(frozen=True)
class GroupMember:
    rank: int
    world: int
    ip: str
    port_data: int
    port_ctrl: int

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        return cls(**d)


class Group:
    """A group of sessions, one per rank, connected to each other."""

    def __init__(self, session, members, rank, conn=ConnType.AUTO, timeout=DEFAULT_TIMEOUT):
        members = sorted(members, key=lambda m: m.rank)
        if [m.rank for m in members] != list(range(len(members))):
            raise ValueError("member ranks must be 0..world-1, each once")
        self.session, self.members, self.rank, self.conn = session, members, rank, conn
        n = len(members)
        ips = (ctypes.c_char_p * n)(*[m.ip.encode() for m in members])
        dports = (ctypes.c_int * n)(*[m.port_data for m in members])
        cports = (ctypes.c_int * n)(*[m.port_ctrl for m in members])
        h = ctypes.c_uint64()
        _check(_L.hmc_group_create(session._h, n, ips, dports, cports, rank, int(conn), _ms(timeout),
                                   ctypes.byref(h)), "group create")
        self._h = h.value

    @property
    def world(self):
        return len(self.members)

    @property
    def me(self):
        return self.members[self.rank]

    def peer(self, r):
        return self.members[r % self.world]

    @property
    def left(self):
        return self.peer(self.rank - 1)

    @property
    def right(self):
        return self.peer(self.rank + 1)

    def close(self):
        if self._h:
            _check(_L.hmc_group_destroy(self._h), "group destroy")
            self._h = 0
        st, self._store = getattr(self, "_store", None), None
        if st is not None:
            st.close()


def init_group(*, session, my_ip, rank=None, members=None, conn=ConnType.AUTO, timeout=DEFAULT_TIMEOUT,
               store=None, world=None):
    """Makes the group. ``session`` must already serve (``init_server``). Members come from
    ``members`` (GroupMember list, or dicts); else, when torch.distributed is initialised, from an
    all-gather of every rank's address; else from the config store: ``store`` (a URL or an
    ``hmc.store.Store``; default ``HMC_STORE_URL``) with ``world`` members (default
    ``HMC_WORLD_SIZE``). With a ``tcp://`` URL the first process to bind its address serves the
    store (it stays up until that process closes the group); ``rank`` None takes the lowest free
    store rank."""
    own_store = None
    if members is None:
        try:
            import torch.distributed as dist
            torch_ready = dist.is_available() and dist.is_initialized()
        except ImportError:
            torch_ready = False
        if store is None and not torch_ready:
            store = os.environ.get("HMC_STORE_URL")
        if store is not None and not torch_ready:
            from .store import Store
            if world is None:
                world = int(os.environ.get("HMC_WORLD_SIZE", "0"))
            if world <= 0:
                raise ValueError("init_group with a store needs world=... (or HMC_WORLD_SIZE)")
            if isinstance(store, str):
                store = own_store = Store(store, rank=rank, world=world, serve=True, timeout=timeout)
            rank = store.rank
            me = GroupMember(rank, world, my_ip, session.data_port, session.ctrl_port).to_dict()
            sg = store.group("hmc-collective", world)
            try:
                members = [json.loads(b) for b in sg.allgather(json.dumps(me).encode(), timeout)]
            finally:
                sg.close()
        elif torch_ready:
            rank, world = dist.get_rank(), dist.get_world_size()
            me = GroupMember(rank, world, my_ip, session.data_port, session.ctrl_port).to_dict()
            gathered = [None] * world
            dist.all_gather_object(gathered, me)
            members = gathered
        else:
            raise RuntimeError("init_group needs members=..., an initialised torch.distributed, or a store")
    members = [m if isinstance(m, GroupMember) else GroupMember.from_dict(m) for m in members]
    if rank is None:
        rank = next(m.rank for m in members if m.ip == my_ip and m.port_data == session.data_port)
    try:
        g = Group(session, members, rank, conn, timeout)
    except BaseException:
        if own_store is not None:
            own_store.close()
        raise
    g._store = own_store
    return g


def alltoall(group, send, recv, *, algo="auto", send_bias=0, recv_bias=None, timeout=DEFAULT_TIMEOUT):
    """All-to-all: block j of ``send`` (nbytes/world bytes) goes to rank j, which receives it as
    block ``group.rank`` of ``recv``. Buffer layout: send at send_bias, receive at recv_bias
    (default right after), ring scratch after that."""
    if algo not in _ALGOS:
        raise ValueError(f"algo must be one of {sorted(_ALGOS)}")
    _, total, _, _ = _source(send)
    _, cap, _, _ = _dest(recv)
    if cap != total or total % group.world:
        raise ValueError("send and recv must have the same size, divisible by the group size")
    block = total // group.world
    if recv_bias is None:
        recv_bias = send_bias + total
    scratch = max(send_bias, recv_bias) + total
    s = group.session
    s.buf.put(send, send_bias)
    _check(_L.hmc_group_alltoall(group._h, _ALGOS[algo], send_bias, recv_bias, scratch, block, _ms(timeout)),
           "alltoall")
    s.buf.get_into(recv, total, recv_bias)
    return recv
