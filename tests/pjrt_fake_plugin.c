/* Broken PJRT plugins for tests/test_pjrt_runtime.py, one per -D flag (cc -shared -fPIC):
 *   FAKE_NO_ENTRY     a shared library that exports no GetPjrtApi
 *   FAKE_OLD_API      GetPjrtApi reports PJRT C API 0.50
 *   FAKE_NO_CLIENT    API 0.115 whose PJRT_Client_Create fails with a message
 * Only the first slots of the function table are filled: the runtime must fail before it
 * calls anything else. Layout: PJRT_Api (struct_size, extension_start, version {struct_size,
 * extension_start, major, minor}, then function pointers in slot order, as
 * csrc/runtime/pjrt_c_api.h numbers them). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef FAKE_NO_ENTRY

typedef struct {
  size_t struct_size;
  void* extension_start;
  const void* error;
  const char* message;
  size_t message_size;
} ErrorMessageArgs;

typedef struct {
  size_t struct_size;
  void* extension_start;
  const void* error;
  int code;
} ErrorCodeArgs;

typedef struct {
  size_t struct_size;
  void* extension_start;
  const void* attributes;
  size_t num_attributes;
} AttributesArgs;

static const char kMessage[] = "fake plugin: no device here (CUDA_ERROR_NO_DEVICE)";
static int the_error;

static void error_destroy(void* args) { (void)args; }
static void error_message(ErrorMessageArgs* args) {
  args->message = kMessage;
  args->message_size = strlen(kMessage);
}
static void* error_code(ErrorCodeArgs* args) {
  args->code = 13; /* INTERNAL */
  return NULL;
}
static void* ok(void* args) {
  (void)args;
  return NULL;
}
static void* attributes(AttributesArgs* args) {
  args->attributes = NULL;
  args->num_attributes = 0;
  return NULL;
}
static void* client_create(void* args) {
  (void)args;
  return &the_error;
}

#define SLOTS 118 /* the table of API 0.81 and later is at least this long */
static struct {
  size_t struct_size;
  void* extension_start;
  struct {
    size_t struct_size;
    void* extension_start;
    int major_version;
    int minor_version;
  } version;
  void* functions[SLOTS];
} api;

const void* GetPjrtApi(void) {
  api.struct_size = sizeof api;
  api.version.struct_size = sizeof api.version;
#ifdef FAKE_OLD_API
  api.version.minor_version = 50;
#else
  api.version.minor_version = 115;
#endif
  for (int i = 0; i < SLOTS; ++i) api.functions[i] = (void*)ok;
  api.functions[0] = (void*)error_destroy;
  api.functions[1] = (void*)error_message;
  api.functions[2] = (void*)error_code;
  api.functions[4] = (void*)attributes;
  api.functions[10] = (void*)client_create;
  return &api;
}

#else
int not_a_plugin(void) { return 0; }
#endif
