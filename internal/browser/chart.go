package browser

import (
	"context"
	"fmt"

	"github.com/chromedp/chromedp"
)

// Chart is what ReadChart finds in an SVG chart as Chromium renders it.
type Chart struct {
	// Texts are every text element's content, in document order.
	Texts []string `json:"texts"`
	// Problems are what makes it hard to read: two texts overlapping, a
	// drawn line or area crossing a text, a numeric tick that is not a whole
	// number.
	Problems []string `json:"problems"`
}

// chartJS measures the rendered SVG: every text's box, what is painted
// inside it (document.elementsFromPoint on a 3-px grid: stroked lines
// and filled areas, not the white background), and the numeric labels.
const chartJS = `(() => {
  const problems = [];
  const texts = [...document.querySelectorAll("text")];
  const boxes = texts.map(t => ({el: t, s: t.textContent.trim(), r: t.getBoundingClientRect()}));
  const shrink = 1;
  const overlap = (a, b) => a.left + shrink < b.right - shrink && b.left + shrink < a.right - shrink &&
                            a.top + shrink < b.bottom - shrink && b.top + shrink < a.bottom - shrink;
  for (let i = 0; i < boxes.length; i++)
    for (let j = i + 1; j < boxes.length; j++)
      if (boxes[i].s && boxes[j].s && overlap(boxes[i].r, boxes[j].r))
        problems.push("texts overlap: " + JSON.stringify(boxes[i].s) + " and " + JSON.stringify(boxes[j].s));
  const paints = el => {
    if (el.tagName !== "path" && el.tagName !== "line" && el.tagName !== "polyline" && el.tagName !== "rect") return false;
    const cs = getComputedStyle(el);
    const white = c => c === "rgb(255, 255, 255)";
    const stroked = cs.stroke !== "none" && !white(cs.stroke) && parseFloat(cs.strokeWidth) > 0;
    const filled = cs.fill !== "none" && !white(cs.fill);
    return stroked || filled;
  };
  for (const b of boxes) {
    if (!b.s) continue;
    let hit = null;
    for (let x = b.r.left + 2; x < b.r.right - 2 && !hit; x += 3)
      for (let y = b.r.top + 2; y < b.r.bottom - 2 && !hit; y += 3)
        for (const el of document.elementsFromPoint(x, y))
          if (el !== b.el && paints(el)) { hit = el; break; }
    if (hit) problems.push("a " + hit.tagName + " crosses the text " + JSON.stringify(b.s));
  }
  for (const b of boxes)
    if (/^-?[0-9]+([.][0-9]+)?$/.test(b.s) && !/^-?[0-9]+$/.test(b.s))
      problems.push("tick label " + JSON.stringify(b.s) + " is not a whole number");
  return {texts: boxes.map(b => b.s), problems};
})()`

// ReadChart loads the SVG at url in the browser of ctx (see New) and
// measures it.
func ReadChart(ctx context.Context, url string) (*Chart, error) {
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS("svg"))); err != nil {
		return nil, fmt.Errorf("browser: load %s: %w", url, err)
	}
	c, err := chromedp.Run(ctx, chromedp.Evaluate[Chart](chartJS))
	if err != nil {
		return nil, fmt.Errorf("browser: measure %s: %w", url, err)
	}
	return &c, nil
}
