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

// A fixed window of 2 requests per second announcing itself in IETF
// rate-limit fields, on a frozen clock so the output is exact.
func Example_rateLimitHeaders() {
	at := time.Date(2026, 6, 2, 6, 0, 0, 250e6, time.UTC)
	dest, err := fakedest.New(fakedest.Config{
		Now: func() time.Time { return at },
		Rules: map[string]fakedest.Rule{
			"/api/": {Window: time.Second, WindowLimit: 2, Headers: fakedest.IETF},
		},
	})
	if err != nil {
		panic(err)
	}
	if err := dest.Start(); err != nil {
		panic(err)
	}
	defer dest.Close()

	for range 3 {
		resp, err := http.Get(dest.URL() + "/api/items")
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("%d RateLimit=%s Retry-After=%q\n", resp.StatusCode, resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After"))
	}
	fmt.Println("policy:", dest.Requests()[0].RateLimit.Get("RateLimit-Policy"))
	t := dest.Tally("/api/", time.Time{}, time.Time{})
	fmt.Printf("accepted %d, limited %d (%.0f%%)\n", t.Accepted, t.Limited, 100*t.LimitedShare())
	// Output:
	// 200 RateLimit="default";r=1;t=1 Retry-After=""
	// 200 RateLimit="default";r=0;t=1 Retry-After=""
	// 429 RateLimit="default";r=0;t=1 Retry-After="1"
	// policy: "default";q=2;w=1
	// accepted 2, limited 1 (33%)
}
