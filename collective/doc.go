// Package collective runs collective operations over a group of Communicators: today the
// all-to-all of upstream's hmc.collective, with a direct algorithm and a ring that really is an
// all-to-all (upstream's ring block arithmetic is not). Completion is signalled correctly:
// every block a rank receives was put, and its put completed (visible), before the sender
// told the receiver, so when AllToAll returns every receive block is in place.
//
// Members are given explicitly (rank, data address, control address); the Python package
// gathers them through torch.distributed when it is initialised.
package collective
