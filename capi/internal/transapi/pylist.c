// hmc_py_u64s: Python lists of ints as uint64_t in one C pass, for the Python package's batch
// calls (issue 34: array.array('Q') of a 1,024-entry list takes 14-17 us, CPython's conversion
// per entry; this loop takes under 2 us). No Python header is needed: the caller (ctypes, with
// the GIL held: a PYFUNCTYPE prototype) passes the list objects, the addresses of the list and
// int type objects (id(list), id(int)) and which object layout its CPython has:
//   1: CPython 3.0-3.11, PyVarObject's ob_size holds the signed digit count;
//   2: CPython 3.12-3.14, PyLongObject's lv_tag holds the digit count << 3 | sign (0 positive,
//      1 zero, 2 negative).
// Both keep the list's item pointer array at offset 24 and an int's 30-bit digits from offset
// 24 (64-bit builds without Py_TRACE_REFS and with the GIL; the package checks, and checks the
// result on known values before it uses this). Anything else (an entry of another type, a
// subclass of int such as bool, a negative number, one of 2^64 or more) makes it decline: the
// package converts those lists its usual way, which names the entry it refuses.

#include <stdint.h>
#include <stdlib.h>

#include "_cgo_export.h"

typedef struct {
	intptr_t refcnt;
	const void *type;
	intptr_t size; // ob_size, or lv_tag in layout 2
} hmc_pyobj;

// hmc_request is fabric/trans.Request as Go lays it out (transapi.go asserts it).
typedef struct {
	int64_t op;
	uint64_t local, remote, size;
} hmc_request;

typedef struct {
	hmc_pyobj head;
	const hmc_pyobj *const *item;
} hmc_pylist;

// value reads int o into *v as layout has it; false for an object that is not a plain int
// in 0..2^64-1.
static inline int value(const hmc_pyobj *o, const void *int_type, int layout, uint64_t *v) {
	if (o->type != int_type)
		return 0;
	intptr_t nd;
	if (layout == 1) {
		nd = o->size;
	} else {
		uintptr_t tag = (uintptr_t)o->size;
		nd = (tag & 3) == 1 ? 0 : (tag & 3) == 2 ? -1 : (intptr_t)(tag >> 3);
	}
	const uint32_t *d = (const uint32_t *)(o + 1);
	switch (nd) {
	case 0:
		*v = 0;
		return 1;
	case 1:
		*v = d[0];
		return 1;
	case 2:
		*v = d[0] | (uint64_t)d[1] << 30;
		return 1;
	case 3:
		if (d[2] >= 16) // 2^64 or more
			return 0;
		*v = d[0] | (uint64_t)d[1] << 30 | (uint64_t)d[2] << 60;
		return 1;
	default: // negative, or too large
		return 0;
	}
}

// list is l as a list of n entries, or NULL.
static inline const hmc_pylist *list(const void *l, const void *list_type, int64_t n) {
	const hmc_pylist *p = l;
	return p != 0 && p->head.type == list_type && p->head.size == n ? p : 0;
}

// one converts list l (n entries) into out; false at an entry it does not take whole. An entry
// that is the same object as the one before it (a KV batch's lengths: [size] * n) takes the
// value already read, without its loads.
static int one(const void *l, const void *list_type, const void *int_type, int layout, uint64_t *out, int64_t n) {
	const hmc_pylist *p = list(l, list_type, n);
	if (p == 0)
		return 0;
	const hmc_pyobj *prev = 0;
	uint64_t v = 0;
	for (int64_t i = 0; i < n; i++) {
		const hmc_pyobj *o = p->item[i];
		if (o != prev) {
			if (!value(o, int_type, layout, &v))
				return 0;
			prev = o;
		}
		out[i] = v;
	}
	return 1;
}

// hmc_py_u64s converts the first nlists (1 to 3) of lists a, b and c, each exactly a list of n
// entries, into out (n entries each, one list after another): a batch's three lists in one
// call (the call costs as much as converting 1,000 entries). Returns n, or -1 when any list
// is not such a list or holds an entry it does not take whole, or layout is unknown.
int64_t hmc_py_u64s(int nlists, const void *a, const void *b, const void *c, const void *list_type,
		    const void *int_type, int layout, uint64_t *out, int64_t n) {
	const void *lists[3] = {a, b, c};
	if (nlists < 1 || nlists > 3 || out == 0 || n < 0 || (layout != 1 && layout != 2))
		return -1;
	for (int k = 0; k < nlists; k++)
		if (!one(lists[k], list_type, int_type, layout, out + k * n, n))
			return -1;
	return n;
}

// What hmc_py_setup was given: the interpreter's list and int types, its layout and its
// PyEval_SaveThread and PyEval_RestoreThread.
static const void *py_list, *py_int;
static int py_layout;
static void *(*py_save)(void);
static void (*py_restore)(void *);

// hmc_py_setup tells hmc_py_trans_transfer the interpreter's types, layout (as hmc_py_u64s)
// and the addresses of its PyEval_SaveThread and PyEval_RestoreThread. Returns 0, or -1 for an
// unknown layout or a missing argument (the fused call then declines every batch).
int hmc_py_setup(const void *list_type, const void *int_type, int layout, void *save, void *restore) {
	if (list_type == 0 || int_type == 0 || save == 0 || restore == 0 || (layout != 1 && layout != 2))
		return -1;
	py_list = list_type;
	py_int = int_type;
	py_layout = layout;
	py_save = (void *(*)(void))save;
	py_restore = (void (*)(void *))restore;
	return 0;
}

// requests reads lists a, b and c (n entries each: locals, remotes, sizes) into q in one pass,
// each request written whole and each list's repeated object read once, and sets *total to
// the sizes' sum (saturated); false where a list is not one it takes whole or a request runs
// past the address space.
static int requests(const void *a, const void *b, const void *c, int64_t n, int op, hmc_request *q, uint64_t *total) {
	const hmc_pylist *la = list(a, py_list, n), *lb = list(b, py_list, n), *lc = list(c, py_list, n);
	if (la == 0 || lb == 0 || lc == 0)
		return 0;
	const hmc_pyobj *pa = 0, *pb = 0, *pc = 0;
	uint64_t va = 0, vb = 0, vc = 0, sum = 0;
	for (int64_t i = 0; i < n; i++) {
		const hmc_pyobj *oa = la->item[i], *ob = lb->item[i], *oc = lc->item[i];
		if (oa != pa && !value(pa = oa, py_int, py_layout, &va))
			return 0;
		if (ob != pb && !value(pb = ob, py_int, py_layout, &vb))
			return 0;
		if (oc != pc && !value(pc = oc, py_int, py_layout, &vc))
			return 0;
		if (va + vc < va || vb + vc < vb) // past the address space: the checked path names it
			return 0;
		q[i] = (hmc_request){op, va, vb, vc};
		sum = sum + vc < sum ? UINT64_MAX : sum + vc;
	}
	*total = sum;
	return 1;
}

// hmc_py_trans_transfer is hmc_trans_transfer for a batch given as three CPython lists of n
// plain ints (locals, remotes, sizes), called with the GIL held (a PYFUNCTYPE prototype): it
// reads the lists straight into the engine's request table (fabric/trans.Request's layout,
// which transapi.go asserts at compile time), releases the GIL while the batch runs, as ctypes
// does for a library call, and takes it back. One pass where the package made three (issue 34:
// a ctypes call and its array, and the library's own pass from the arrays to requests: about
// 2 us of a 1,024-entry batch). Returns hmc_trans_transfer's status, or -1 without releasing
// the GIL when it does not take the lists whole (hmc_py_setup not called, n out of
// 1..2^20, a list not a list of n such ints, a range past the address space): the package
// then converts them its checked way, which names what is wrong.
int hmc_py_trans_transfer(uint64_t engine, const char *peer, int op, const void *a, const void *b, const void *c,
			  int64_t n, int timeout_ms) {
	enum { stack_entries = 256 }; // 8 KiB: a Python thread may have a small stack (threading.stack_size)
	hmc_request here[stack_entries];
	if (py_save == 0 || n < 1 || n > (1 << 20))
		return -1;
	hmc_request *q = here;
	if (n > stack_entries && (q = malloc((size_t)n * sizeof *q)) == 0)
		return -1;
	uint64_t total;
	int rc = -1;
	if (requests(a, b, c, n, op, q, &total)) {
		void *ts = py_save();
		rc = hmc_trans_run(engine, (char *)peer, q, (uint64_t)n, total, timeout_ms);
		py_restore(ts);
	}
	if (q != here)
		free(q);
	return rc;
}

// NumPy's ndarray as its headers lay it out (PyArrayObject_fields, the same in NumPy 1.x and
// 2.x); the package checks the reads on known arrays before it uses them.
typedef struct {
	intptr_t refcnt;
	const void *type;
	const uint64_t *data;
	int nd;
	const intptr_t *dims;
	const intptr_t *strides;
	const void *base;
	const void *descr;
	int flags;
} hmc_ndarray;

// What hmc_py_setup_numpy was given: numpy.ndarray and numpy.dtype(numpy.uint64).
static const void *np_array, *np_u64;

// hmc_py_setup_numpy tells hmc_py_trans_arrays NumPy's ndarray type and its uint64 dtype
// object (id(numpy.ndarray), id(numpy.dtype(numpy.uint64))). Returns 0, or -1 for a null one.
int hmc_py_setup_numpy(const void *ndarray_type, const void *u64_dtype) {
	if (ndarray_type == 0 || u64_dtype == 0)
		return -1;
	np_array = ndarray_type;
	np_u64 = u64_dtype;
	return 0;
}

// hmc_py_array_data is the memory of NumPy array o when it is exactly an ndarray of that
// uint64 dtype, one-dimensional, n entries, 8 bytes apart; else NULL.
const uint64_t *hmc_py_array_data(const void *o, int64_t n) {
	const hmc_ndarray *a = o;
	if (a == 0 || np_array == 0 || a->type != np_array || a->descr != np_u64 || a->nd != 1 || a->dims[0] != n ||
	    a->strides[0] != 8 || a->data == 0)
		return 0;
	return a->data;
}

// hmc_py_trans_arrays is hmc_trans_transfer for a batch given as three such NumPy arrays of
// n entries (locals, remotes, sizes), called with the GIL held: it reads their memory's
// addresses where the package's checks took three attribute look-ups and a buffer export
// each (issue 34: about a microsecond a batch), and releases the GIL while the batch runs.
// Returns hmc_trans_transfer's status, or -1 without releasing the GIL when an array is not
// such an array (the package then takes its checked way).
int hmc_py_trans_arrays(uint64_t engine, const char *peer, int op, const void *a, const void *b, const void *c,
			int64_t n, int timeout_ms) {
	const uint64_t *da = hmc_py_array_data(a, n), *db = hmc_py_array_data(b, n), *dc = hmc_py_array_data(c, n);
	if (py_save == 0 || n < 1 || n > (1 << 20) || da == 0 || db == 0 || dc == 0)
		return -1;
	void *ts = py_save();
	int rc = hmc_trans_transfer(engine, (char *)peer, op, (uint64_t *)da, (uint64_t *)db, (uint64_t *)dc,
				    (uint64_t)n, 0, timeout_ms);
	py_restore(ts);
	return rc;
}
