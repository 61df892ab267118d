/* What programs read of a device beyond the verbs calls: the provider's
 * verbs_device around each ibv_device, and where sysfs is. Run with
 * softroce's library first on the loader's path (cabi/tests/librdmacm.rs runs
 * it with SYSFS_PATH unset and set; tools/stock-programs through softroce run). */
#include <stdint.h>
#include "common.h"

/* rdma-core v44's struct verbs_device (libibverbs/driver.h, which Debian does
 * not install): providers reach it from an ibv_device with container_of. */
struct verbs_device_v44 {
    struct ibv_device device;
    const void *ops;
    int refcount;
    void *entry[2];
    void *sysfs;
    uint64_t core_support;
};

/* Exported at IBVERBS_1.0 and declared in driver.h too. */
const char *ibv_get_sysfs_path(void);

int main(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list != NULL && n > 0, "ibv_get_device_list");
    /* mlx5's is_mlx5_dev and efa's is_efa_dev compare ops with their own. */
    for (int i = 0; i < n; i++)
        CHECK(((struct verbs_device_v44 *)list[i])->ops == NULL, "the ops after each ibv_device are NULL");
    if (list)
        ibv_free_device_list(list);

    const char *path = ibv_get_sysfs_path();
    CHECK(path != NULL, "ibv_get_sysfs_path is never NULL");
    const char *env = getenv("SYSFS_PATH");
    char want[300] = "/sys";
    if (env) {
        snprintf(want, sizeof want, "%s", env);
        for (size_t len = strlen(want); len > 0 && want[len - 1] == '/'; len--)
            want[len - 1] = '\0';
    }
    CHECK(path && strcmp(path, want) == 0, "ibv_get_sysfs_path is $SYSFS_PATH without trailing slashes, or /sys: "
          "got %s, want %s", path ? path : "NULL", want);
    setenv("SYSFS_PATH", "/elsewhere", 1);
    CHECK(ibv_get_sysfs_path() == path, "ibv_get_sysfs_path: the first answer, kept");
    return finish("device");
}
