// Package memcopy copies bytes between memories the runtime does not treat specially: the
// pieces of a transfer, where Go's copy (an AVX loop with non-temporal prefetches) runs at a
// third of `rep movsb`'s speed on pieces that are not in the caches on the AMD machines we
// measure (BenchmarkPieces). Copy picks `rep movsb` where the CPU has ERMS and the piece is
// large enough for it to pay, and Go's copy elsewhere, and in race-detector builds (which see
// only Go's copy).
package memcopy
