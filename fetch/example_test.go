package fetch_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/fleetpace/fleetpace/fetch"
)

// errQuotaExhausted is what a hypothetical API client returns when the
// account's daily quota is used up.
var errQuotaExhausted = errors.New("daily quota exhausted")

// apiClient stands in for a platform SDK.
type apiClient struct{ quotaLeft int }

func (c *apiClient) Posts(ctx context.Context, account string) (etag string, n int, err error) {
	if c.quotaLeft == 0 {
		return "", 0, errQuotaExhausted
	}
	c.quotaLeft--
	return `"rev-7"`, 3, nil
}

// apiFetcher fetches a source through an SDK instead of plain HTTP. It maps
// the SDK's answers onto fleetpace's outcomes; returning fetch.RateLimited
// is how it tells the worker "this platform says stop": the worker then
// cools the whole platform down instead of counting a failure.
type apiFetcher struct{ client *apiClient }

func (f apiFetcher) Fetch(ctx context.Context, req fetch.Request) fetch.Result {
	start := time.Now()
	etag, n, err := f.client.Posts(ctx, req.URL)
	res := fetch.Result{ETag: req.ETag, LastModified: req.LastModified}
	switch {
	case errors.Is(err, errQuotaExhausted):
		res.Outcome = fetch.RateLimited
		res.RetryAfter = time.Hour
		res.Reason = err.Error()
	case err != nil:
		res.Outcome, res.Reason = fetch.Failed, err.Error()
	case etag == req.ETag:
		res.Outcome = fetch.NotModified
	default:
		res.Outcome, res.ETag, res.Bytes = fetch.OK, etag, int64(n)
	}
	res.Duration = time.Since(start)
	return res
}

// A custom Fetcher: an API client whose quota runs out on the third call.
func ExampleFetcher() {
	var f fetch.Fetcher = apiFetcher{client: &apiClient{quotaLeft: 2}}

	req := fetch.Request{SourceID: 1, Platform: "example-api", URL: "account/42"}
	for range 3 {
		res := f.Fetch(context.Background(), req)
		fmt.Printf("%s etag=%s reason=%q\n", res.Outcome, res.ETag, res.Reason)
		req.ETag = res.ETag // the worker keeps the validators for the next fetch
	}
	// Output:
	// ok etag="rev-7" reason=""
	// not_modified etag="rev-7" reason=""
	// rate_limited etag="rev-7" reason="daily quota exhausted"
}

// The built-in HTTP fetcher doing a conditional GET.
func ExampleNewHTTP() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-None-Match") == `"v1"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", `"v1"`)
		fmt.Fprint(w, "hello")
	}))
	defer srv.Close()

	f, err := fetch.NewHTTP(fetch.HTTPConfig{
		AllowPrivateNetworks: true, // the test server is on 127.0.0.1
	})
	if err != nil {
		panic(err)
	}
	res := f.Fetch(context.Background(), fetch.Request{URL: srv.URL})
	fmt.Println(res.Outcome, res.Status, res.ETag, res.Bytes, res.ContentHash[:12])

	res = f.Fetch(context.Background(), fetch.Request{URL: srv.URL, ETag: res.ETag})
	fmt.Println(res.Outcome, res.Status, res.ETag)
	// Output:
	// ok 200 "v1" 5 2cf24dba5fb0
	// not_modified 304 "v1"
}
