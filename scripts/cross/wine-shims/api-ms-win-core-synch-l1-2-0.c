/* Wine 8.0 (Debian 12) lacks api-ms-win-core-synch-l1-2-0.dll; its kernelbase has the functions.
   Used only to run the addon under Wine (scripts/cross/build.sh); Windows 8+ has this DLL. */
#include <windows.h>
static FARPROC get(const char *name) { return GetProcAddress(GetModuleHandleA("kernelbase.dll") ? GetModuleHandleA("kernelbase.dll") : LoadLibraryA("kernelbase.dll"), name); }
__declspec(dllexport) BOOL WINAPI WaitOnAddress(volatile VOID *a, PVOID c, SIZE_T s, DWORD ms) {
  static BOOL (WINAPI *f)(volatile VOID *, PVOID, SIZE_T, DWORD); if (!f) f = (void *)get("WaitOnAddress"); return f(a, c, s, ms); }
__declspec(dllexport) VOID WINAPI WakeByAddressSingle(PVOID a) {
  static VOID (WINAPI *f)(PVOID); if (!f) f = (void *)get("WakeByAddressSingle"); f(a); }
__declspec(dllexport) VOID WINAPI WakeByAddressAll(PVOID a) {
  static VOID (WINAPI *f)(PVOID); if (!f) f = (void *)get("WakeByAddressAll"); f(a); }
