/*
 * NOT CANN. A declaration-compatible stand-in for the ACL runtime interfaces that
 * aicpu_kernels/npu_ext/ uses (see cann_stub/npu/README.md); no CANN code. Names and
 * signatures follow the public acl/acl_rt.h and acl/acl_base_rt.h.
 */
#ifndef AICPU_TILING_STUB_ACL_H
#define AICPU_TILING_STUB_ACL_H

#include <cstddef>
#include <cstdint>

extern "C" {
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef int aclError;
static const int ACL_SUCCESS = 0;

/* Event flag: the event can be waited on across streams inside a captured graph. */
#define ACL_EVENT_SYNC 0x00000001U

aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag);
aclError aclrtDestroyEvent(aclrtEvent event);
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);
const char *aclGetRecentErrMsg();
}

#endif
