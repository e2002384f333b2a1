/* MXMOE_API marks what the shared library exports: the public C++ API (namespace mxmoe in
 * include/mxmoe) and the C ABI (c_api.h). Everything else is built with hidden visibility
 * (-fvisibility=hidden), so libmxmoe.so exports nothing a caller could come to depend on by
 * accident (the ExportedSymbols test checks the list). C and C++; includes nothing. */
#ifndef MXMOE_EXPORT_H
#define MXMOE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define MXMOE_API __attribute__((visibility("default")))
#else
#define MXMOE_API
#endif

#endif /* MXMOE_EXPORT_H */
