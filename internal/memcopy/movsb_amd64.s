#include "textflag.h"

// func movsb(dst, src unsafe.Pointer, n uintptr)
TEXT ·movsb(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	REP; MOVSB
	RET
