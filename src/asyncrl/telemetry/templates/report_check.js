(function(){
  var figs=document.querySelectorAll('figure.chart'),ok=0,empty=[];
  figs.forEach(function(f){
    var marks=f.querySelectorAll('svg .data'),seen=false;
    marks.forEach(function(m){var b=m.getBBox();if(b.width>0||b.height>0){seen=true;}});
    f.setAttribute('data-rendered',seen?'1':'0');
    if(seen){ok++;}else{empty.push(f.id);}
  });
  var b=document.body;
  b.setAttribute('data-charts-total',String(figs.length));
  b.setAttribute('data-charts-rendered',String(ok));
  b.setAttribute('data-charts-empty',empty.join(','));
  b.setAttribute('data-js-errors',String(window.__asyncrlErrors.length));
  b.setAttribute('data-js-error-messages',window.__asyncrlErrors.join(' | '));
  b.setAttribute('data-report-checked','1');
})();
