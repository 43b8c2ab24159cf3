// hmc_py_u64s: a Python list of ints as uint64_t in one C pass, for the Python package's batch
// calls (issue 34: array.array('Q') of a 1,024-entry list takes 14-17 us, CPython's conversion
// per entry; this loop takes under 2 us). No Python header is needed: the caller (ctypes, with
// the GIL held: a PYFUNCTYPE prototype) passes the list object, the addresses of the list and
// int type objects (id(list), id(int)) and which object layout its CPython has:
//   1: CPython 3.0-3.11, PyVarObject's ob_size holds the signed digit count;
//   2: CPython 3.12-3.14, PyLongObject's lv_tag holds the digit count << 3 | sign (0 positive,
//      1 zero, 2 negative).
// Both keep the list's item pointer array at offset 24 and an int's 30-bit digits from offset
// 24 (64-bit builds without Py_TRACE_REFS and with the GIL; the package checks, and checks the
// result on known values before it uses this). Anything else (an entry of another type, a
// subclass of int such as bool, a negative number, one of 2^64 or more) stops the loop at that
// entry: the package converts that list its usual way, which names the entry it refuses.

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

// Returns n when all n entries were converted into out; the index of the first entry it did
// not convert; -1 when list is not a list (exactly) of n entries or layout is unknown.
int64_t hmc_py_u64s(const void *list, const void *list_type, const void *int_type, int layout,
		    uint64_t *out, int64_t n) {
	const hmc_pylist *l = list;
	if (l == 0 || out == 0 || n < 0 || (layout != 1 && layout != 2) || l->head.type != list_type ||
	    l->head.size != n)
		return -1;
	for (int64_t i = 0; i < n; i++) {
		const hmc_pyobj *o = l->item[i];
		if (o->type != int_type)
			return i;
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
				return i;
			out[i] = d[0] | (uint64_t)d[1] << 30 | (uint64_t)d[2] << 60;
			break;
		default: // negative, or too large
			return i;
		}
	}
	return n;
}
