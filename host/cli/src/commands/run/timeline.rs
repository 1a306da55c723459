//! `--timeline FILE.html`: a run as one self-contained HTML page, drawn
//! here as SVG: nothing is loaded from anywhere, no script runs.
//!
//! One lane for the plan's groups, then one per call in batch order: its
//! planning steps, the wait for its turn, the steps of its turn coloured by
//! kind, its progress as ticks, and its outcome. Every mark carries its
//! figures as a tooltip (`<title>`). Every string a tool controls (names,
//! ids, messages) is escaped.

use std::fmt::Write as _;

use keel_host::events::{Step, StepTime};

use super::record::{Group, Layout, Placed, Recording, shorten};
use super::stats::duration;
use crate::commands::size;

/// The width of the drawing, in px: it fits a 1200 px window.
const WIDTH: f64 = 1150.0;
/// Where the time axis begins, after the lane labels.
const PLOT_LEFT: f64 = 250.0;
/// Where it ends, leaving room for the last call's outcome.
const PLOT_RIGHT: f64 = WIDTH - 120.0;
/// The height of the axis above the lanes.
const AXIS: f64 = 34.0;
/// The height of one lane.
const LANE: f64 = 30.0;
/// The height of a bar in a lane.
const BAR: f64 = 16.0;
/// About the width of a character of the small labels, in px.
const LABEL_CHAR: f64 = 6.2;
/// How many characters of a lane's label (tool and id) fit before the axis.
const LANE_LABEL_CHARS: usize = 30;
/// The narrowest a mark is drawn, so that a step of a few µs still shows.
const MIN_MARK: f64 = 2.0;

/// The colour of each step, and of waiting.
fn colour(step: Step) -> &'static str {
    match step {
        Step::Questions => "#8fb8ff",
        Step::Setup => "#c3a6f0",
        Step::Permission => "#f5b942",
        Step::Call => "#2f6fde",
        Step::Budget => "#3fbfae",
    }
}

/// The colour of an outcome: green for ok, red for a failure of the tool
/// or its input, orange for a refusal, purple for a limit, grey for an
/// interrupt.
fn outcome_colour(outcome: &str) -> &'static str {
    match outcome {
        "ok" => "#2e9d4f",
        "denied" => "#e07b00",
        "limit" => "#8e44ad",
        "interrupted" | "unfinished" => "#7a7a7a",
        _ => "#d64545",
    }
}

/// `text` safe inside an HTML or SVG element or a quoted attribute.
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            // A control character (but a tab or a line break) is no text
            // XML allows: the drawing would not be well-formed.
            c if c.is_control() && !matches!(c, '\t' | '\n' | '\r') => escaped.push('\u{fffd}'),
            c => escaped.push(c),
        }
    }
    escaped
}

/// The page for `recording`: `title` above it, `summary` under the title.
pub fn page(recording: &Recording, title: &str, summary: &str) -> String {
    let layout = Layout::of(recording);
    let mut svg = String::new();
    let span = (layout.end_us - layout.origin_us).max(1) as f64;
    let x = |at_us: u64| PLOT_LEFT + (layout.relative(at_us) as f64) / span * (PLOT_RIGHT - PLOT_LEFT);
    let lanes = 1 + layout.calls.len();
    let height = AXIS + LANE * lanes as f64 + 8.0;

    // The axis, with a grid line at each label.
    let step = tick_step(span);
    let mut tick = 0.0;
    while tick <= span + 0.5 {
        let at = PLOT_LEFT + tick / span * (PLOT_RIGHT - PLOT_LEFT);
        let _ = write!(
            svg,
            r##"<line x1="{at:.1}" y1="{top}" x2="{at:.1}" y2="{height}" class="grid"/><text x="{at:.1}" y="{label}" class="tick">{text}</text>"##,
            top = AXIS - 6.0,
            label = AXIS - 12.0,
            text = axis_label(tick, step, span),
        );
        tick += step;
    }

    // The plan.
    let plan_y = AXIS;
    let _ = write!(svg, r##"<text x="12" y="{:.1}" class="lane">plan</text>"##, plan_y + LANE / 2.0 + 4.0);
    for Group { group, label, span } in &layout.groups {
        let Some((start, end)) = span else { continue };
        let (left, right) = (x(*start), x(*end).max(x(*start) + MIN_MARK));
        let class = if group.concurrent { "group concurrent" } else { "group alone" };
        let _ = write!(
            svg,
            r##"<g><title>{tip}</title><rect x="{left:.1}" y="{y:.1}" width="{w:.1}" height="{BAR}" rx="3" class="{class}"/>"##,
            tip = escape(&format!("{label}\n{}\n{}", group.tool_use_ids.join(", "), duration(end - start))),
            y = plan_y + (LANE - BAR) / 2.0,
            w = right - left,
        );
        // The label inside when it fits, else a shorter one; its tooltip
        // always has it.
        let short = if group.concurrent {
            crate::commands::counted(group.tool_use_ids.len(), "call")
        } else {
            label.trim_start_matches("alone: ").to_string()
        };
        let fits = |text: &str| text.chars().count() as f64 * LABEL_CHAR + 8.0 <= right - left;
        if let Some(text) = [label.as_str(), short.as_str()].into_iter().find(|text| fits(text)) {
            let _ = write!(
                svg,
                r##"<text x="{x:.1}" y="{y:.1}" class="group-label">{text}</text>"##,
                x = left + 4.0,
                y = plan_y + (LANE - BAR) / 2.0 + 12.0,
                text = escape(text),
            );
        }
        svg.push_str("</g>");
    }

    for (index, placed) in layout.calls.iter().enumerate() {
        let top = AXIS + LANE * (index + 1) as f64;
        lane(&mut svg, &layout, placed, top, &x);
    }

    let legend: String = Step::ALL
        .into_iter()
        .map(|step| format!(r##"<span><i style="background:{}"></i>{}</span>"##, colour(step), step.as_str()))
        .chain([
            r##"<span><i class="waiting-swatch"></i>waiting for its turn</span>"##.to_string(),
            r##"<span><i class="tick-swatch"></i>progress</span>"##.to_string(),
        ])
        .chain(
            [
                ("ok", "ok"),
                ("error", "error, invalid, crashed"),
                ("denied", "denied"),
                ("limit", "limit"),
                ("interrupted", "interrupted"),
            ]
            .into_iter()
            .map(|(outcome, label)| {
                format!(r##"<span><b style="color:{}">●</b> {label}</span>"##, outcome_colour(outcome))
            }),
        )
        .collect();

    format!(
        r##"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2430; background: #fff; margin: 20px 24px; }}
h1 {{ font-size: 18px; margin: 0 0 2px; }}
.summary {{ color: #4a5568; margin: 0 0 10px; }}
.legend {{ display: flex; flex-wrap: wrap; gap: 6px 16px; font-size: 12px; color: #4a5568; margin-bottom: 8px; }}
.legend i {{ display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 5px; vertical-align: -1px; }}
.legend .waiting-swatch {{ background: repeating-linear-gradient(135deg, #d3dae6 0 3px, #fff 3px 6px); border: 1px solid #c9d0db; box-sizing: border-box; }}
.legend .tick-swatch {{ width: 2px; background: #1d2430; }}
svg text {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; }}
.grid {{ stroke: #edf0f4; }}
.tick {{ font-size: 11px; fill: #718096; text-anchor: middle; }}
.lane {{ font-size: 13px; font-weight: 600; fill: #1d2430; }}
.id {{ font-size: 11px; fill: #8a94a6; font-weight: 400; }}
.group.concurrent {{ fill: #e6effd; stroke: #9dbbf0; }}
.group.alone {{ fill: #fdf0e0; stroke: #e8bb80; }}
.group-label {{ font-size: 11px; fill: #2d3748; }}
.waiting {{ fill: url(#waiting); stroke: #c9d0db; stroke-width: 0.5; }}
.turn {{ fill: none; stroke-width: 1.5; }}
.outcome {{ font-size: 12px; font-weight: 600; }}
.progress {{ stroke: #1d2430; stroke-width: 1.5; }}
.refused {{ font-size: 12px; font-style: italic; }}
g:hover > rect {{ filter: brightness(0.9); }}
</style>
</head>
<body>
<h1>{title}</h1>
<p class="summary">{summary}</p>
<div class="legend">{legend}</div>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}">
<defs><pattern id="waiting" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff"/><rect width="3" height="6" fill="#d3dae6"/></pattern></defs>
{svg}
</svg>
</body>
</html>
"##,
        title = escape(title),
        summary = escape(summary),
    )
}

/// The lane of one call, its top at `top`.
fn lane(svg: &mut String, layout: &Layout<'_>, placed: &Placed<'_>, top: f64, x: &impl Fn(u64) -> f64) {
    let call = placed.call;
    let outcome = call.outcome();
    let bar_y = top + (LANE - BAR) / 2.0;
    let _ = write!(
        svg,
        r##"<g><title>{tip}</title><svg width="{clip}" height="{clip_h:.1}"><text x="12" y="{y:.1}" class="lane">{tool} <tspan class="id">{id}</tspan></text></svg></g>"##,
        clip = PLOT_LEFT - 14.0,
        clip_h = top + LANE,
        tip = escape(&figures_tip(placed)),
        y = top + LANE / 2.0 + 4.0,
        tool = escape(&shorten(&call.tool, LANE_LABEL_CHARS.saturating_sub(4))),
        id = escape(&shorten(
            &call.tool_use_id,
            LANE_LABEL_CHARS.saturating_sub(call.tool.chars().count() + 1).max(4)
        )),
    );
    let planned_end = placed.planning.iter().map(|step| step.end_us()).max();
    if let (Some(planned_end), Some(((start, _), _))) = (planned_end, placed.turn)
        && start > planned_end
    {
        let _ = write!(
            svg,
            r##"<g><title>{tip}</title><rect x="{left:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" class="waiting"/></g>"##,
            tip = escape(&format!("{} waited {} for its turn", call.tool, duration(start - planned_end))),
            left = x(planned_end),
            y = bar_y + 3.0,
            w = (x(start) - x(planned_end)).max(0.5),
            h = BAR - 6.0,
        );
    }
    for step in placed.planning.iter().chain(&placed.steps) {
        step_mark(svg, layout, &call.tool, step, bar_y, x);
    }
    match placed.turn {
        Some(((start, end), _)) => {
            let (left, right) = (x(start), x(end).max(x(start) + MIN_MARK));
            let colour = outcome_colour(&outcome);
            let _ = write!(
                svg,
                r##"<rect x="{left:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" rx="2" class="turn" stroke="{colour}"/>"##,
                y = bar_y - 2.0,
                w = right - left,
                h = BAR + 4.0,
            );
            let _ = write!(
                svg,
                r##"<text x="{at:.1}" y="{y:.1}" class="outcome" fill="{colour}">{mark} {outcome} <tspan class="id">{wall}</tspan></text>"##,
                at = right + 6.0,
                y = bar_y + 12.5,
                mark = if outcome == "ok" { "✓" } else { "✗" },
                outcome = escape(&outcome),
                wall = duration(end - start),
            );
        }
        None if placed.planning.is_empty() => {
            let _ = write!(
                svg,
                r##"<g><title>{tip}</title><text x="{PLOT_LEFT}" y="{y:.1}" class="refused" fill="{colour}">✗ refused before it was planned: {why}</text></g>"##,
                tip = escape(&figures_tip(placed)),
                y = bar_y + 12.5,
                colour = outcome_colour(&outcome),
                why = escape(&shorten(call.error.as_deref().unwrap_or(&outcome), 110)),
            );
        }
        None => {}
    }
    for report in &call.reports {
        let at = x(report.at_us);
        let _ = write!(
            svg,
            r##"<g><title>{tip}</title><line x1="{at:.1}" y1="{y1:.1}" x2="{at:.1}" y2="{y2:.1}" class="progress"/><path d="M{l:.1},{y1:.1} L{r:.1},{y1:.1} L{at:.1},{tip_y:.1} Z" fill="#1d2430"/></g>"##,
            tip = escape(&format!(
                "{} at {}: {}",
                report.kind,
                duration(layout.relative(report.at_us)),
                report.text()
            )),
            y1 = bar_y - 5.0,
            y2 = bar_y + BAR + 3.0,
            l = at - 3.5,
            r = at + 3.5,
            tip_y = bar_y - 0.5,
        );
    }
}

/// One step as a coloured bar with its tooltip.
fn step_mark(
    svg: &mut String,
    layout: &Layout<'_>,
    tool: &str,
    step: &StepTime,
    y: f64,
    x: &impl Fn(u64) -> f64,
) {
    let left = x(step.start_us);
    let width = (x(step.end_us()) - left).max(MIN_MARK);
    let _ = write!(
        svg,
        r##"<g><title>{tip}</title><rect x="{left:.1}" y="{y:.1}" width="{width:.1}" height="{BAR}" fill="{fill}"/></g>"##,
        tip = escape(&format!(
            "{tool}: {} {} at {}",
            step.step.as_str(),
            duration(step.duration_us),
            duration(layout.relative(step.start_us))
        )),
        fill = colour(step.step),
    );
}

/// Everything known of a call, for the tooltip of its label.
fn figures_tip(placed: &Placed<'_>) -> String {
    let call = placed.call;
    let mut tip = format!("{} ({})\noutcome: {}", call.tool, call.tool_use_id, call.outcome());
    if let Some(activity) = &call.activity {
        let _ = write!(tip, "\nactivity: {activity}");
    }
    if let Some(error) = &call.error {
        let _ = write!(tip, "\nresult: {error}");
    }
    if let Some(wall) = call.wall_us() {
        let _ = write!(tip, "\nwall: {}", duration(wall));
    }
    if let Some(figures) = &call.figures {
        let steps: Vec<String> = Step::ALL
            .into_iter()
            .map(|step| format!("{} {}", step.as_str(), duration(figures.duration_us(step))))
            .collect();
        let _ = write!(tip, "\n{}", steps.join(", "));
        if let Some(fuel) = figures.fuel {
            let _ = write!(tip, "\nfuel: {fuel}");
        }
        if let Some(peak) = figures.memory_peak {
            let _ = write!(tip, "\nmemory peak: {}", size(peak));
        }
        let _ = write!(tip, "\nin: {}, out: {}", size(figures.bytes_in), size(figures.bytes_out));
    }
    tip
}

/// The label of the axis at `at_us`, in the unit an axis `span_us` long
/// suits, with as many decimals as its `step_us` needs: `0`, `250 µs`,
/// `2.5 ms`, `1.5 s`.
fn axis_label(at_us: f64, step_us: f64, span_us: f64) -> String {
    if at_us == 0.0 {
        return "0".into();
    }
    let (scale, unit) = match span_us {
        span if span >= 2e6 => (1e6, "s"),
        span if span >= 2e3 => (1e3, "ms"),
        _ => (1.0, "µs"),
    };
    let step = step_us / scale;
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    format!("{:.decimals$} {unit}", at_us / scale)
}

/// The distance between two labels of an axis `span_us` long: 1, 2 or 5
/// times a power of ten, giving 5 to 10 labels.
fn tick_step(span_us: f64) -> f64 {
    let rough = span_us / 8.0;
    let power = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|factor| factor * power)
        .find(|step| *step >= rough)
        .unwrap_or(power * 10.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_control_character_xml_refuses() {
        assert_eq!(escape("a\0b\u{1b}[31m\u{7}\u{85}\tc\n"), "a\u{fffd}b\u{fffd}[31m\u{fffd}\u{fffd}\tc\n");
    }

    #[test]
    fn escape_leaves_no_markup() {
        assert_eq!(
            escape(r##"<script>alert("x")</script> & 'y'"##),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn axis_labels_take_the_unit_of_their_span() {
        assert_eq!(axis_label(0.0, 5_000.0, 36_000.0), "0");
        assert_eq!(axis_label(10_000.0, 5_000.0, 36_000.0), "10 ms");
        assert_eq!(axis_label(2_500.0, 500.0, 3_000.0), "2.5 ms");
        assert_eq!(axis_label(400.0, 200.0, 1_500.0), "400 µs");
        assert_eq!(axis_label(1_500_000.0, 500_000.0, 4_000_000.0), "1.5 s");
    }

    #[test]
    fn ticks_are_round_and_few() {
        assert_eq!(tick_step(412_000.0), 100_000.0);
        assert_eq!(tick_step(80.0), 10.0);
        assert_eq!(tick_step(1_500.0), 200.0);
    }
}
