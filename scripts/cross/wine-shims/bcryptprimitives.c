/* Wine 8.0 (Debian 12) lacks bcryptprimitives.dll, where Rust's std gets ProcessPrng (Windows 10+).
   Used only to run the addon under Wine (scripts/cross/build.sh): RtlGenRandom stands in. */
#include <windows.h>
BOOLEAN WINAPI SystemFunction036(PVOID, ULONG);
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE p, SIZE_T n) {
  while (n) { ULONG k = n > 0x10000000 ? 0x10000000 : (ULONG)n; if (!SystemFunction036(p, k)) return FALSE; p += k; n -= k; }
  return TRUE; }
