/* The C ABI from C: the library's version and a context on the best backend. */
#include <stdio.h>
#include <string.h>

#include <mxmoe/c_api.h>
#include <mxmoe/version.h>

int main(void) {
  mxmoe_context ctx = NULL;
  if (mxmoe_context_create(NULL, &ctx) != MXMOE_OK) {
    fprintf(stderr, "mxmoe_context_create: %s\n", mxmoe_last_error());
    return 1;
  }
  mxmoe_context_destroy(ctx);
  printf("C ABI: libmxmoe %s, headers %s\n", mxmoe_version(), MXMOE_VERSION);
  return strcmp(mxmoe_version(), MXMOE_VERSION) == 0 ? 0 : 1;
}
