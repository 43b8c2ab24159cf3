// Package group is the group engine of the memory-pool layer: barriers, rank-ordered
// allgathers, keyed sub-groups, an atomic number allocator, an exit broadcast and dynamic
// membership, all built on the primitives of a config store (package coord/store), so they
// work the same on the embedded store and on etcd.
//
// A Group has a View: a version and the sorted ranks of its members. A static group (Config.Size
// > 0) is ranks 0..Size-1 at version 0 for its whole life. A dynamic group starts empty; Join
// and Leave change it, and so does the death of a member (the store's rank-down event: every
// live member races to remove it and exactly one new view results).
//
// Views are immutable store keys "view/<v>"; a change is a create-if-absent CompareAndSwap of
// "view/<v+1>", so concurrent joins, leaves and removals are serialised by the store and no
// lock (upstream's EVENT key, which a dying joiner could leave held) is needed. Every member
// watches for the next version and adopts it; OnViewChange callbacks run in version order.
//
// Collectives (Barrier, AllGather) run among the members of the caller's current view, keyed
// by (version, round); all members must call them in the same order, at the same view version
// (after a change, WaitView until every member sees it). Round n's keys are removed by the
// first member to arrive at round n+2. Every wait has a deadline (the context's, else
// Config.Timeout), and a member that dies during a collective turns it into a
// *MemberDownError naming its rank instead of a hang.
package group
