package fakedest_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// A destination that allows 5 requests per second (burst 2) under /a/ and
// tells /b/ to go away for ten minutes; a test then asserts the ceiling with
// MaxInWindow.
func Example() {
	dest, err := fakedest.New(fakedest.Config{Rules: map[string]fakedest.Rule{
		"/a/": {Rate: 5, Burst: 2, RetryAfter: 2 * time.Second},
		"/b/": fakedest.Blocked(10 * time.Minute),
	}})
	if err != nil {
		panic(err)
	}
	if err := dest.Start(); err != nil {
		panic(err)
	}
	defer dest.Close()

	for _, path := range []string{"/a/1", "/a/2", "/a/3", "/b/1"} {
		resp, err := http.Get(dest.URL() + path)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("%s %d Retry-After=%q\n", path, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	fmt.Println("accepted in any 1-s window:", fakedest.MaxInWindow(dest.Arrivals("/a/", 200), time.Second))
	// Output:
	// /a/1 200 Retry-After=""
	// /a/2 200 Retry-After=""
	// /a/3 429 Retry-After="2"
	// /b/1 429 Retry-After="600"
	// accepted in any 1-s window: 2
}
