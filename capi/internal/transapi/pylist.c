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

typedef struct {
	intptr_t refcnt;
	const void *type;
	intptr_t size; // ob_size, or lv_tag in layout 2
} hmc_pyobj;

typedef struct {
	hmc_pyobj head;
	const hmc_pyobj *const *item;
} hmc_pylist;

// one converts list l (n entries) into out; false at an entry it does not take whole.
static int one(const hmc_pylist *l, const void *list_type, const void *int_type, int layout, uint64_t *out,
	       int64_t n) {
	if (l == 0 || l->head.type != list_type || l->head.size != n)
		return 0;
	for (int64_t i = 0; i < n; i++) {
		const hmc_pyobj *o = l->item[i];
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
			out[i] = 0;
			break;
		case 1:
			out[i] = d[0];
			break;
		case 2:
			out[i] = d[0] | (uint64_t)d[1] << 30;
			break;
		case 3:
			if (d[2] >= 16) // 2^64 or more
				return 0;
			out[i] = d[0] | (uint64_t)d[1] << 30 | (uint64_t)d[2] << 60;
			break;
		default: // negative, or too large
			return 0;
		}
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
