/* base/json_strict.h's builders: an entry that could not be added (here the NULL a
 * constructor returns out of memory) marks the document failed, and one that was added
 * leaves the mark as it was. */
#include <jansson.h>
#include <string.h>

#include "base/json_strict.h"
#include "tests/harness.h"

TG_TEST(test_base_json_build_records_dropped_entries) {
    json_t *obj = json_object(), *arr = json_array();
    REQUIRE(obj && arr, "out of memory");
    int failed = 0;
    tg_json_put(obj, "a", json_integer(1), &failed);
    tg_json_push(arr, json_string("x"), &failed);
    CHECK(!failed && json_object_size(obj) == 1 && json_array_size(arr) == 1, "added entries: failed %d", failed);
    CHECK(json_integer_value(json_object_get(obj, "a")) == 1 && !strcmp(json_string_value(json_array_get(arr, 0)), "x"),
          "the entries hold what was put");
    tg_json_put(obj, "b", NULL, &failed);
    CHECK(failed == 1 && json_object_size(obj) == 1 && !json_object_get(obj, "b"), "a NULL value: failed %d", failed);
    failed = 0;
    tg_json_push(arr, NULL, &failed);
    CHECK(failed == 1 && json_array_size(arr) == 1, "a NULL element: failed %d", failed);
    /* The mark stays set once set: a later entry that is added does not clear it. */
    tg_json_put(obj, "c", json_true(), &failed);
    tg_json_push(arr, json_false(), &failed);
    CHECK(failed == 1 && json_object_size(obj) == 2 && json_array_size(arr) == 2, "after a failure: failed %d", failed);
    json_decref(obj);
    json_decref(arr);
}
